"""End-to-end test of structured output and tool calls in `dray serve`, with the
`openai` client and the `jsonschema` package: response_format json_object and
json_schema (over 30 varied schemas and prompts, sent 8 at a time beside free
requests), the client's parse() with a pydantic model, a GBNF grammar, a tool
loop (the application runs the tool and sends its result back), tool_choice
none/auto/required/named, parallel calls, and the streamed forms of both.

usage: test_structured.py --dray build/tools/dray --model .models/smollm2-135m-instruct-q4_1.gguf
       [--model2 .models/gemma-3-270m-q4_k_m.gguf]  (the byte-fallback tokenizer)
"""
import argparse
import concurrent.futures as cf
import json
import sys
import time

import jsonschema
import openai
import pydantic

from test_serve import KEY, Server, check

SCHEMAS = [
    ({"type": "object", "properties": {"name": {"type": "string", "maxLength": 30},
                                        "age": {"type": "integer", "minimum": 0, "maximum": 150}},
      "required": ["name", "age"]}, "Give a person's name and age as JSON."),
    ({"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                        "population": {"type": "integer", "minimum": 0}},
      "required": ["city"]}, "Describe a city as JSON."),
    ({"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 2, "maxItems": 4},
     "List a few fruits as a JSON array."),
    ({"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
      "required": ["colour"]}, "Pick a colour."),
    ({"type": "object", "properties": {"answer": {"type": "boolean"}}, "required": ["answer"]},
     "Is the sky blue? Answer in JSON."),
    ({"type": "object", "properties": {"temperature": {"type": "integer", "minimum": -40, "maximum": 40},
                                        "unit": {"const": "C"}}, "required": ["temperature", "unit"]},
     "What is the temperature today?"),
    ({"type": "object", "properties": {"title": {"type": "string", "maxLength": 50},
                                        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12},
                                                 "maxItems": 3}},
      "required": ["title", "tags"]}, "Give a blog post title with tags."),
    ({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
      "required": ["x", "y"]}, "Give a point in the plane."),
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"}},
      "required": ["code"]}, "Invent a product code."),
    ({"type": "object", "properties": {"nickname": {"anyOf": [{"type": "string", "maxLength": 20},
                                                               {"type": "null"}]}},
      "required": ["nickname"]}, "Does the cat have a nickname?"),
    ({"type": "object", "properties": {"address": {"type": "object", "properties": {
        "street": {"type": "string", "maxLength": 30}, "number": {"type": "integer", "minimum": 1}},
        "required": ["street", "number"]}}, "required": ["address"]}, "Write an address."),
    ({"type": "integer", "minimum": 1, "maximum": 10}, "Rate the film from 1 to 10."),
    ({"type": "string", "enum": ["yes", "no", "maybe"]}, "Will it rain?"),
    ({"type": "object", "properties": {"steps": {"type": "array", "items": {"type": "string", "maxLength": 40},
                                                  "minItems": 1, "maxItems": 3}},
      "required": ["steps"]}, "How do you make tea?"),
    ({"type": "object", "properties": {"ok": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 40}},
      "required": ["ok"], "additionalProperties": False}, "Is water wet?"),
    ({"type": "object", "properties": {"date": {"type": "string", "format": "date"}},
      "required": ["date"]}, "When is the meeting?"),
    ({"type": "object", "properties": {"id": {"type": "string", "format": "uuid"}}, "required": ["id"]},
     "Give a new id."),
    ({"type": "object", "properties": {"score": {"type": "integer", "exclusiveMinimum": 0,
                                                  "exclusiveMaximum": 100}},
      "required": ["score"]}, "Score the essay."),
    ({"type": "object", "properties": {"word": {"type": "string", "minLength": 3, "maxLength": 8}},
      "required": ["word"]}, "Give a word."),
    ({"type": "object", "properties": {"pair": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 10},
                                                                                {"type": "integer"}],
                                                 "items": False}},
      "required": ["pair"]}, "Give a name and a number."),
    ({"$defs": {"node": {"type": "object", "properties": {
        "value": {"type": "integer", "minimum": 0, "maximum": 9},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["value", "children"]}}, "$ref": "#/$defs/node"}, "Write a small tree."),
    ({"type": "object", "properties": {"kind": {"enum": [1, "two", None, True]}}, "required": ["kind"]},
     "Pick a kind."),
    ({"type": "object", "properties": {"price": {"type": "number", "minimum": 0}, "currency": {
        "enum": ["EUR", "USD"]}}, "required": ["price", "currency"]}, "What does the book cost?"),
    ({"type": "object", "properties": {"matrix": {"type": "array", "items": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 2},
        "minItems": 2, "maxItems": 2}}, "required": ["matrix"]}, "Write a 2x2 matrix."),
    ({"type": "object", "properties": {"first": {"type": "string", "maxLength": 15},
                                        "last": {"type": "string", "maxLength": 15},
                                        "email": {"type": "string", "maxLength": 40}},
      "required": ["first", "last"]}, "Make up a contact."),
    ({"type": ["string", "integer"]}, "Give a string or a number."),
    ({"type": "object", "properties": {"event": {"type": "string", "maxLength": 30},
                                        "when": {"type": "string", "format": "date-time"}},
      "required": ["event", "when"]}, "Schedule an event."),
    ({"type": "object", "properties": {"letters": {"type": "array", "items": {"type": "string",
                                                                              "pattern": "^[a-z]$"},
                                                    "minItems": 3, "maxItems": 3}},
      "required": ["letters"]}, "Give three letters."),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 100, "maximum": 999}},
      "required": ["n"]}, "Give a three-digit number."),
    ({"type": "object", "properties": {"status": {"const": "done"}, "count": {"type": "integer", "minimum": 0,
                                                                              "maximum": 5}},
      "required": ["status", "count"]}, "Report the task status."),
    ({"type": "object", "properties": {"lang": {"enum": ["C", "Python", "Rust"]},
                                        "reason": {"type": "string", "maxLength": 60}},
      "required": ["lang", "reason"]}, "Which language should I learn?"),
    ({"type": "object", "properties": {"flag": {"type": "null"}}, "required": ["flag"]}, "Give nothing."),
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                   "required": ["city"]}}}


def test_schemas(cli, model):
    def one(item):
        schema, prompt = item
        r = cli.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=160, temperature=0.7,
            seed=7, response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema,
                                                                            "strict": True}})
        return schema, r.choices[0]

    def free(_):  # unconstrained requests in the same batches
        return cli.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=16).choices[0]
    with cf.ThreadPoolExecutor(8) as ex:
        frees = [ex.submit(free, i) for i in range(4)]
        results = list(ex.map(one, SCHEMAS))
        [f.result() for f in frees]
    stopped = 0
    for schema, c in results:
        if c.finish_reason == "stop":
            stopped += 1
            jsonschema.validate(json.loads(c.message.content), schema)
    check(stopped >= len(SCHEMAS) * 3 // 4,
          f"{stopped} of {len(SCHEMAS)} schemas finished with stop, and every one of them validates")
    r = cli.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe a cat."}],
                                    max_tokens=120, response_format={"type": "json_object"}, seed=3)
    c = r.choices[0]
    check(c.finish_reason == "length" or isinstance(json.loads(c.message.content), dict),
          f"json_object gives a JSON object: {c.message.content[:60]!r}")
    long = {"type": "object", "properties": {"text": {"type": "string", "minLength": 40}}, "required": ["text"]}
    r = cli.chat.completions.create(model=model, messages=[{"role": "user", "content": "Describe a dog."}],
                                    max_tokens=4, response_format={"type": "json_schema", "json_schema": {
                                        "name": "d", "schema": long}})
    check(r.choices[0].finish_reason == "length", "a constrained reply cut by max_tokens finishes with length")


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    age: int = pydantic.Field(ge=0, le=120)


def test_parse(cli, model):
    r = cli.beta.chat.completions.parse(model=model, messages=[{"role": "user", "content":
                                        "Invent a person with a name and an age."}],
                                        response_format=Person, max_tokens=100, seed=11)
    p = r.choices[0].message.parsed
    check(isinstance(p, Person), f"parse() with a pydantic model gives one: {p!r}")


def test_stream_json(cli, model):
    schema = SCHEMAS[0][0]
    chunks = list(cli.chat.completions.create(
        model=model, messages=[{"role": "user", "content": SCHEMAS[0][1]}], max_tokens=100, stream=True,
        seed=5, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)
    check(True, f"streamed structured output validates: {text!r}")


def test_grammar(srv, model):
    st, d = srv.json("/v1/completions", {"model": model, "prompt": "The answer is", "max_tokens": 10,
                                          "grammar": 'root ::= " " ("yes" | "no") "."'})
    check(st == 200 and d["choices"][0]["text"] in (" yes.", " no.") and d["choices"][0]["finish_reason"] == "stop",
          f"a GBNF grammar constrains a completion: {d['choices'][0]['text']!r}")
    st, d = srv.json("/v1/completions", {"model": model, "prompt": "x", "grammar": "root ::= foo"})
    check(st == 400 and d["error"]["param"] == "grammar", f"a bad grammar is a 400: {d['error']['message']}")
    st, d = srv.json("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "x"}],
                                               "response_format": {"type": "json_schema", "json_schema": {
                                                   "name": "n", "schema": {"type": "string", "contentEncoding": "base64"}}}})
    check(st == 400 and "contentEncoding" in d["error"]["param"],
          f"an unsupported JSON Schema keyword is a 400 naming it: {d['error']['param']}")


def test_tools(cli, model):
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = cli.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME], tool_choice="required",
                                    max_tokens=120, seed=1)
    c = r.choices[0]
    check(c.finish_reason == "tool_calls" and c.message.tool_calls and c.message.content is None,
          f"tool_choice required gives calls: {c.message.tool_calls}")
    call = c.message.tool_calls[0]
    fn = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
    jsonschema.validate(json.loads(call.function.arguments), fn["function"]["parameters"])
    check(call.id.startswith("call_") and call.type == "function", "the call's arguments validate")
    # the application runs the tool and sends the result back
    msgs += [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 18, "sky": "clear"})}]
    r2 = cli.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME], max_tokens=40, seed=2)
    c2 = r2.choices[0]
    check(c2.finish_reason in ("stop", "length", "tool_calls"),
          f"the tool loop goes on with the result: {c2.finish_reason} {c2.message.content!r}")
    r3 = cli.chat.completions.create(model=model, messages=msgs[:1], tools=[WEATHER, TIME],
                                     tool_choice={"type": "function", "function": {"name": "get_time"}},
                                     max_tokens=80, parallel_tool_calls=False)
    calls = r3.choices[0].message.tool_calls
    check(len(calls) == 1 and calls[0].function.name == "get_time",
          f"a named function is the one called, once without parallel calls: {calls[0].function}")
    r4 = cli.chat.completions.create(model=model, messages=msgs[:1], tools=[WEATHER], tool_choice="none",
                                     max_tokens=10)
    check(r4.choices[0].message.tool_calls is None, "tool_choice none answers in text")
    r5 = cli.chat.completions.create(model=model, messages=msgs[:1], tools=[WEATHER, TIME], max_tokens=80)
    c5 = r5.choices[0]
    check((c5.finish_reason == "tool_calls") == bool(c5.message.tool_calls),
          f"auto: a text answer or calls ({c5.finish_reason})")
    chunks = list(cli.chat.completions.create(model=model, messages=msgs[:1], tools=[WEATHER, TIME],
                                              tool_choice="required", max_tokens=120, stream=True, seed=1))
    deltas = [tc for ch in chunks if ch.choices for tc in (ch.choices[0].delta.tool_calls or [])]
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    check(deltas and deltas[0].function.name == call.function.name and
          json.loads(deltas[0].function.arguments) == json.loads(call.function.arguments) and
          finish == ["tool_calls"], f"streamed tool_calls deltas, finish tool_calls: {deltas[0].function}")


def test_refused(srv, model):
    for body, param in [
            ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
            ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"functions": []}, "functions"),
            ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
             "response_format")]:
        st, d = srv.json("/v1/chat/completions", dict({"model": model, "messages": [{"role": "user", "content": "x"}]},
                                                      **body))
        check(st == 400 and d["error"]["param"] == param, f"{list(body)}: 400 naming {param!r}")


def run(dray, model_path, full):
    srv = Server(dray, model_path, ["--set", "max_prompt_tokens=900", "--set", "max_completion_tokens=200"])
    try:
        cli = openai.OpenAI(base_url=srv.base + "/v1", api_key=KEY, max_retries=0, timeout=300)
        model = cli.models.list().data[0].id
        steps = [lambda: test_schemas(cli, model), lambda: test_parse(cli, model),
                 lambda: test_stream_json(cli, model), lambda: test_grammar(srv, model),
                 lambda: test_refused(srv, model)]
        if full:
            steps.append(lambda: test_tools(cli, model))
        for step in steps:
            t0 = time.time()
            step()
            print(f"  ({time.time() - t0:.1f} s)")
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dray", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--model2")
    a = ap.parse_args()
    run(a.dray, a.model, True)
    if a.model2:
        run(a.dray, a.model2, False)
    print("all structured-output checks passed")


if __name__ == "__main__":
    sys.exit(main())
