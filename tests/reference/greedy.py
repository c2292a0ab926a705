"""Greedy decoding checked with one reference forward pass (teacher forcing).

The reference's greedy continuation after a prompt is: argmax of the last
position's logits, append, repeat. With causal attention the logits at position
p depend only on tokens 0..p, so one forward pass over prompt + the tokens dray
generated gives, at row len(prompt) - 1 + k, exactly the reference's next-token
choice after dray's first k tokens. dray's greedy tokens equal the reference's
greedy tokens iff every one of those rows picks dray's next token (and, when dray
stopped early, the row after its last token picks a stop token). That is one
pass of len(prompt) + n tokens instead of n passes of growing length: the same
check, about n/2 times less reference compute.
"""
import numpy as np


def first_difference(ref_logits, n_prompt, dray_tokens, n_max, stops):
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
