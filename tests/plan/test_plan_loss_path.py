"""The planner's loss working set follows the path the update takes: the fused head + loss
(loss/fused.py) holds two float32 [token_chunk, vocabulary] blocks, the separate path (log-probs, then the loss)
one, or two with a frozen head or the entropy bonus; and the trace takes the path a run takes.

Until the fused loss read its separability check as one boolean (``fused._not_separable``), the trace, whose
float reads are placeholders (trace/fake_data.py), ran the non-separable fallback's second chunked pass on every
micro-batch: a block more than any run holds, and the planner's block counts had been fitted to it."""

from __future__ import annotations

import pytest

import slimgrpo.forward.passes as passes
import slimgrpo.loss.fused as fused
from slimgrpo.config import from_dict, merge_overrides
from slimgrpo.runspec.run import fused_loss, run_spec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.plan.render import category_rows
from slimgrpo.plan.admission import trace_config

pytestmark = pytest.mark.usefixtures("one_thread")

# a vocabulary far above the hidden size, so the [chunk, V] blocks set the loss line; 2 x 300 completion tokens
# in chunks of 96 (the last one shorter)
SHAPE = ModelShape("qwen2", hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1, vocab=6_000, tie=True,
                   max_positions=1 << 16)
BASE = ["rollout.num_generations=2", "run.batch_size=2", "loss.beta=0.04", "data.max_prompt_length=20",
        "rollout.max_completion_length=300", "loss.token_chunk=96", "memory.gradient_checkpointing=false",
        "memory.tiled_mlp=off", "memory.share_prompt_forward=false"]
# (variant, overrides, fused): each rule of update/micro_loss.py's choice
VARIANTS = [
    ("default", [], True),
    ("fuse off", ["loss.fuse_head_loss=false"], False),
    ("vocab chunks", ["loss.vocab_chunk=2500"], False),
    ("entropy bonus", ["loss.entropy_coef=0.01"], False),
    ("top-entropy mask", ["loss.top_entropy_quantile=0.5"], False),
    ("GSPO, old log-probs", ["loss.importance_sampling_level=sequence", "loss.num_iterations=2"], False),
    ("token ratio, old log-probs", ["loss.num_iterations=2"], True),
]


def _config(device: str, lora: bool, extra: list[str]):
    return from_dict(merge_overrides({}, [*BASE, f"run.device={device}", f"lora.enabled={str(lora).lower()}",
                                          f"model.dtype={'float32' if device == 'cpu' else 'bfloat16'}", *extra]))


@pytest.mark.parametrize("variant,extra,expected", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_the_plan_knows_which_path_the_update_takes(variant, extra, expected, monkeypatch):
    """The planner's rule against the update's own choice, seen in a traced step (the real update code)."""
    calls = {"fused": 0}
    real = passes.completion_loss

    def counted(*args, **kwargs):
        calls["fused"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr("slimgrpo.update.micro_loss.completion_loss", counted)
    cfg = _config("cpu", False, extra)
    trace_config(cfg, SHAPE, device="cpu", generation=False)
    assert (calls["fused"] > 0) == expected == fused_loss(cfg), variant


def test_the_trace_never_runs_the_fallback_of_a_separable_objective(monkeypatch):
    ran = []
    monkeypatch.setattr(fused, "_correct", lambda *a, **k: ran.append(1))
    trace_config(_config("cpu", True, []), SHAPE, device="cpu", generation=False)
    assert not ran  # the old float comparison read 1.0 > 1e-6 from fake tensors: the fallback ran


# Off by more than 10%, as test_plan_matrix.py's KNOWN_OFF: xfail with the measured ratio, never a wider band
KNOWN_OFF = {("cuda", False, "entropy bonus"): "traced 0.85 of the plan: the separate path with the entropy bonus, "
                                               "bf16, full fine-tuning (the safe side)"}
# the fast suite's share: every path and device once, full and LoRA; `pytest -m slow` runs the other twelve
QUICK = {("cpu", False, "default"), ("cpu", True, "fuse off"), ("cuda", False, "vocab chunks"),
         ("cuda", True, "entropy bonus")}


def _marks(key):
    marks = [] if key in QUICK else [pytest.mark.slow]
    if key in KNOWN_OFF:
        marks.append(pytest.mark.xfail(reason=KNOWN_OFF[key], strict=False))
    return marks


CASES = [pytest.param(d, lora, v, extra, id=f"{d}-{'lora' if lora else 'full'}-{v}", marks=_marks((d, lora, v)))
         for d in ("cpu", "cuda") for lora in (False, True) for v, extra, _ in VARIANTS[:4]]


@pytest.mark.parametrize("device,lora,variant,extra", CASES)
def test_the_loss_line_matches_its_trace_on_every_path(device, lora, variant, extra):
    """The plan's loss line against what the trace holds after the decoder: in forward (``loss working set``)
    and, where the head's gradients are formed in backward (the separate path), in backward."""
    cfg = _config(device, lora, extra)
    plan = plan_memory(SHAPE, run_spec(cfg, device, vocab=SHAPE.vocab))
    trace = trace_config(cfg, SHAPE, device=device, generation=False)
    rows = {name: cells["update"] for name, cells in category_rows(plan, trace)}
    planned = rows["loss working set"][0]
    traced = rows["loss working set"][1] + rows.get("backward (act. grads, recompute)", (0, 0))[1]
    assert 0.9 <= traced / planned <= 1.1, (variant, traced, planned)
