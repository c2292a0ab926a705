"""What the reference checks share, so each is written once: reading GGUF
metadata for the numpy references (gemma3_ref.py, llama_ref.py), driving the
dray command (token ids, logits of every position, greedy tokens), checking
dray's greedy tokens against a reference in one pass, and the log-softmax the
checks compare in.

Nothing here computes a forward pass: each reference stays written from its own
architecture, and none shares code with the C engine (they are the check).
"""
import subprocess

import numpy as np


def field(reader, key, default=None):
    """Scalar or string metadata value of a gguf.GGUFReader, or default when absent."""
    import gguf  # the references check for it first, with their own message

    f = reader.fields.get(key)
    if f is None:
        return default
    if f.types and f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]][0].item()


def dray_ids(dray, model, text, special=False):
    """dray's token ids of text (special: control tokens written in the text count)."""
    cmd = [dray, "tokenize", "-m", model, "--ids"] + (["--special"] if special else [])
    out = subprocess.run(cmd, input=text.encode(), capture_output=True, check=True)
    return [int(x) for x in out.stdout.split()]


def dray_logits(dray, model, ids, extra, path):
    """dray's logits [len(ids)][n_vocab] (float32) of every position, through path."""
    cmd = [dray, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)),
           "--dump-logits", path, "-q", "-c", str(len(ids) + 8)] + extra
    subprocess.run(cmd, check=True)
    return np.fromfile(path, dtype=np.float32).reshape(len(ids), -1)


def dray_greedy(dray, model, ids, n, extra):
    """The ids dray generates greedily (at most n) after the prompt ids."""
    cmd = [dray, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", str(n),
           "--temp", "0", "--print-token-ids", "-q"] + extra
    out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode("utf-8", "replace")
    last = out.rstrip("\n").split("\n")[-1]
    return [int(x) for x in last.split()] if last.strip() else []


# Greedy decoding checked with one reference forward pass (teacher forcing).
#
# The reference's greedy continuation after a prompt is: argmax of the last
# position's logits, append, repeat. With causal attention the logits at position
# p depend only on tokens 0..p, so one forward pass over prompt + the tokens dray
# generated gives, at row len(prompt) - 1 + k, exactly the reference's next-token
# choice after dray's first k tokens. dray's greedy tokens equal the reference's
# greedy tokens iff every one of those rows picks dray's next token (and, when dray
# stopped early, the row after its last token picks a stop token). That is one
# pass of len(prompt) + n tokens instead of n passes of growing length: the same
# check, about n/2 times less reference compute.
def greedy_first_difference(ref_logits, n_prompt, dray_tokens, n_max, stops):
    """ref_logits: reference logits (n_prompt + len(dray_tokens), n_vocab) over the
    prompt followed by dray's tokens. Returns None when the reference's greedy
    run would produce exactly dray_tokens (n_max of them, or fewer ending where
    the reference picks a token of stops), else (k, reference token at k, top-2
    gap of the reference's logits there)."""
    if ref_logits.shape[0] != n_prompt + len(dray_tokens):
        raise ValueError(f"{ref_logits.shape[0]} rows of logits for {n_prompt} + {len(dray_tokens)} tokens")
    for k in range(min(len(dray_tokens) + 1, n_max)):
        row = ref_logits[n_prompt - 1 + k]
        nxt = int(np.argmax(row))
        want_stop = k == len(dray_tokens)
        if (nxt in stops) if want_stop else (nxt == dray_tokens[k] and nxt not in stops):
            continue
        top2 = np.partition(row, -2)[-2:]
        return k, nxt, float(abs(top2[1] - top2[0]))
    return None


def int8_verdict(agree, positions, kl_sum, top1_min, kl_max, failures):
    """Prints the int8 path's totals (top-1 agreement with the reference, mean
    KL(ref||dray)) against their bounds; appends each bound missed to failures."""
    top1, kl_mean = agree / positions, kl_sum / positions
    print(f"\nint8 over {positions} positions: top-1 agreement {100 * top1:.2f}% (need >= "
          f"{100 * top1_min:.0f}%), mean KL(ref||dray) {kl_mean:.5f} (need < {kl_max})")
    if top1 < top1_min:
        failures.append(f"int8 top-1 agreement {top1:.4f} < {top1_min}")
    if kl_mean >= kl_max:
        failures.append(f"int8 mean KL {kl_mean:.5f} >= {kl_max}")


def log_softmax(x):
    """log softmax over the last axis, in float64."""
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
