"""benchmarks/speed/floor.py counts the work of a step by hand; check its token and FLOP accounting with a fake
machine whose every product runs at 1 FLOP/s (so seconds = FLOPs)."""

import pytest

from benchmarks.speed import floor

SHAPE = {"hidden": 8, "intermediate": 24, "layers": 3, "heads": 2, "kv_heads": 1, "vocab": 50}


class UnitMachine:
    def gemm(self, m, k, n, batch=1):
        return 1.0

    def bandwidth(self):
        return 1.0


def naive_update_flops(rows, group, P, T, full_ft=True, reference=True):
    """Products of one update, prompt by prompt and row by row (no closed forms)."""
    h, d = SHAPE["hidden"], SHAPE["hidden"] // SHAPE["heads"]
    linear = sum(2 * a * b for a, b in floor._linear_shapes(SHAPE)) * SHAPE["layers"]  # per token, forward
    tokens = pairs = 0
    for r in range(rows):
        if r % group == 0:  # the group's prompt, once
            tokens += P
            pairs += sum(range(1, P + 1)) - P / 2  # causal half of P^2 (the closed form's P^2 / 2)
        tokens += T
        pairs += sum(P + t + 0.5 for t in range(T))  # each completion token sees the prompt and half itself
    attn = 2 * SHAPE["layers"] * SHAPE["heads"] * 2.0 * pairs * d  # scores + values
    per_pass = linear * tokens
    policy = per_pass * (3 if full_ft else 2) + 3 * attn
    ref = (per_pass + attn) if reference else 0.0
    head_fwd = 2 * rows * T * h * SHAPE["vocab"]
    return policy + ref, head_fwd


@pytest.mark.parametrize("rows,group,P,T", [(6, 3, 7, 5), (4, 1, 9, 11), (8, 8, 13, 3)])
def test_update_floor_counts_each_prompt_once_per_group(rows, group, P, T):
    step = floor.Step(shape=SHAPE, rows=rows, prompt_len=P, completion_len=T, token_chunk=4, rows_per_prompt=group)
    assert step.decoder_tokens == rows // group * P + rows * T
    got = floor.update_floor(step, UnitMachine())
    decoder, head_fwd = naive_update_flops(rows, group, P, T)
    assert got["decoder_policy_s"] + got["decoder_reference_s"] == pytest.approx(decoder, rel=1e-9)
    assert got["lm_head_reference_s"] == pytest.approx(head_fwd)
    assert got["lm_head_policy_s"] == pytest.approx(3 * head_fwd)  # logits, dL/dh, dL/dW


def test_sharing_lowers_only_the_decoder_part():
    alone = floor.update_floor(floor.Step(shape=SHAPE, rows=8, prompt_len=20, completion_len=4), UnitMachine())
    shared = floor.update_floor(floor.Step(shape=SHAPE, rows=8, prompt_len=20, completion_len=4, rows_per_prompt=8),
                                UnitMachine())
    assert shared["decoder_policy_s"] < alone["decoder_policy_s"] / 3
    assert shared["lm_head_policy_s"] == alone["lm_head_policy_s"]
