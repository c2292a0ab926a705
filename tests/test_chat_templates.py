#!/usr/bin/env python3
"""dray's chat templates against the models' own Jinja.

Each tests/fixtures/chat_templates/*.jinja is a model's tokenizer.chat_template
(the text of tokenizer_config.json's "chat_template"). For every fixture and a
set of conversations (with and without a system message, multi-turn, contents
with surrounding whitespace, with and without the generation prompt) this
renders the template with jinja2 the way transformers' apply_chat_template does
(trim_blocks, lstrip_blocks, raise_exception, strftime_now, bos/eos tokens) and
compares the text with what `chat_render FIXTURE ROLE CONTENT ...` prints: dray
choosing the template from the GGUF's template text and rendering it in C.

Usage: test_chat_templates.py --render build/tests/chat_render
Exit 77 (skip) when jinja2 is not installed."""
import argparse
import datetime
import os
import subprocess
import sys

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("skip: jinja2 is not installed")
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "chat_templates")

# fixture -> (name dray must pick, bos_token, eos_token, conversations to skip and why)
FAMILIES = {
    "llama3.0.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.2.jinja": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral-v0.2.jinja": ("mistral-v1", "<s>", "</s>"),
    "mistral-v0.3.jinja": ("mistral", "<s>", "</s>"),
    "phi3.5.jinja": ("phi3", "<s>", "<|endoftext|>"),
    "granite3.0.jinja": ("granite", "<|end_of_text|>", "<|end_of_text|>"),
    "granite3.1.jinja": ("granite", "<|end_of_text|>", "<|end_of_text|>"),
    "olmo2.jinja": ("olmo2", "<|endoftext|>", "<|endoftext|>"),
    "qwen2.5.jinja": ("chatml", None, "<|im_end|>"),
    "gemma2.jinja": ("gemma", "<bos>", "<eos>"),
}

# Gemma 2's template refuses system messages (dray folds them as Gemma 3 does).
NO_SYSTEM = {"gemma2.jinja"}

S = ("system", "You are a terse assistant.")
CONVERSATIONS = [
    [("user", "Hello!")],
    [S, ("user", "Hello!")],
    [("user", " What is 2+2? \n"), ("assistant", " 4 "), ("user", "And 3+3?")],
    [S, ("user", "one"), ("assistant", "reply one"), ("user", "two"), ("assistant", "reply two"),
     ("user", "three")],
    [("system", "  Padded system.\n"), ("user", "\tTabbed user\n")],
    [("system", ""), ("user", "Empty system prompt")],
    [S, ("user", "q"), ("assistant", "a")],  # ends with the assistant (no generation prompt)
    [("user", "Use <|eot_id|> [INST] <|im_start|> <start_of_turn> as text")],
]


def jinja_render(text, messages, gen, bos, eos):
    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    msgs = [{"role": r, "content": c} for r, c in messages]
    return env.from_string(text).render(messages=msgs, add_generation_prompt=gen,
                                        bos_token=bos, eos_token=eos)


def dray_render(render, fixture, messages, gen):
    args = [render] + ([] if gen else ["--no-gen"]) + [fixture]
    for r, c in messages:
        args += [r, c]
    p = subprocess.run(args, capture_output=True)
    if p.returncode:
        raise RuntimeError(p.stderr.decode())
    name = p.stderr.decode().split("template: ", 1)[1].split("\n", 1)[0]
    return name, p.stdout.decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", required=True)
    a = ap.parse_args()
    fails = checks = 0
    for fixture, (want_name, bos, eos) in sorted(FAMILIES.items()):
        path = os.path.join(FIXTURES, fixture)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for conv in CONVERSATIONS:
            if fixture in NO_SYSTEM and conv[0][0] == "system":
                continue
            ends_user = conv[-1][0] == "user"
            for gen in ([True, False] if ends_user else [False]):
                want = jinja_render(text, conv, gen, bos, eos)
                name, got = dray_render(a.render, path, conv, gen)
                checks += 1
                if name != want_name or got != want:
                    fails += 1
                    print(f"FAIL {fixture} gen={gen} {conv!r}\n  template: {name} (want {want_name})"
                          f"\n  jinja: {want!r}\n  dray:  {got!r}")
    print(f"{checks - fails}/{checks} renders equal the Jinja templates'")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
