"""Every formula path of the planner pinned against the trace: a matrix of scaled-down shapes,
{full, LoRA} x {checkpointing on, off} x {tiled MLP on, off} x {unpadded rows, shared prompt} x {offload on, off
where it applies: CUDA with checkpointing} x {vocabulary >> hidden, vocabulary ~ hidden} x {cpu, cuda trace
path}; each phase's traced tensor peak within 10% of the plan's. A new memory trick lands with its row here.

    pytest tests/plan/test_plan_matrix.py                 # a row per dimension (seconds on a quiet machine)
    pytest tests/plan/test_plan_matrix.py -m slow         # the whole matrix (56 traces)

Packed rows are not a column: the trace's synthetic completions are full length, and with every completion full,
packing each prompt once costs more attention pairs (n² for n = g·P + m·T) than the shared-prompt layout
(g·P²/2 + m·T·(P + T)), so ``packed.cheaper`` never picks it here; where it runs (completions that stop early)
the plan is an upper bound (``check.not_modelled``).

Rows off by more than 10% are ``KNOWN_OFF``: marked xfail with the measured ratio and the reason, never with a
wider band. Measured with the whole matrix (trace / plan per phase, printed on failure) after the trace took the
fused loss's separable path and the planner's loss line its path's blocks (tests/plan/test_plan_loss_path.py), and
again after the gradients line counted only those alive at backward's peak (one micro-batch: every row here;
tests/plan/test_plan_gradients.py): three CUDA checkpointing rows came into the band; and after the backward
workspace line took the final norm's backward and a layer's as two moments (tests/plan/test_plan_backward_overlap.py):
the update of every shared-prompt row without checkpointing moved up 3-5 points, two of them into the band.
"""

from __future__ import annotations

import itertools

import pytest

from slimgrpo.config import from_dict, merge_overrides
from slimgrpo.runspec.run import run_spec
from slimgrpo.plan.model import plan_memory
from slimgrpo.runspec.shape import ModelShape
from slimgrpo.plan.admission import trace_config
from slimgrpo.plan.render import plan_tensor_bytes

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPES = {
    # vocabulary 500x the hidden size (W-cpu's Qwen2 shape is 1,187x): the LM head and loss chunks weigh
    "bigV": ModelShape("qwen2", hidden=64, intermediate=176, layers=2, heads=4, kv_heads=2, vocab=32_000, tie=True,
                       max_positions=1 << 20),
    # vocabulary 2.5x the hidden size: the decoder layers weigh, the head is small
    "smallV": ModelShape("llama", hidden=128, intermediate=344, layers=2, heads=4, kv_heads=2, vocab=320, tie=False,
                         max_positions=1 << 20),
}
# one prompt x 4 completions of 512 tokens; unpadded: a short prompt before long completions (sharing would keep
# more); shared: a long prompt before short completions (the update and the no-grad passes share it)
LAYOUTS = {
    "unpadded": ["memory.share_prompt_forward=false", "data.max_prompt_length=24", "rollout.max_completion_length=488"],
    "shared": ["memory.share_prompt_forward=true", "data.max_prompt_length=448", "rollout.max_completion_length=64"],
}


def _rows():
    for device, mode, ckpt, tiled, layout, offload, vocab in itertools.product(
            ("cpu", "cuda"), ("full", "lora"), (False, True), (False, True), tuple(LAYOUTS), (False, True),
            tuple(SHAPES)):
        if ckpt and layout == "shared":
            continue  # the shared-prompt layout needs checkpointing off (forward/shared_prompt.py)
        if offload and not (ckpt and device == "cuda"):
            continue  # offloading applies to checkpoints on CUDA only
        yield (f"{device}-{mode}-{'ckpt' if ckpt else 'nockpt'}-{'tiled' if tiled else 'untiled'}-{layout}-"
               f"{'offload' if offload else 'keep'}-{vocab}")


# Rows a quick run covers: every dimension's values at least once, all within 10%.
QUICK = ("cpu-full-nockpt-untiled-unpadded-keep-bigV", "cpu-full-nockpt-tiled-shared-keep-bigV",
         "cpu-lora-ckpt-untiled-unpadded-keep-bigV", "cpu-lora-nockpt-tiled-unpadded-keep-smallV",
         "cuda-full-nockpt-tiled-unpadded-keep-bigV", "cuda-full-ckpt-untiled-unpadded-offload-bigV",
         "cuda-full-nockpt-untiled-unpadded-keep-smallV", "cuda-lora-nockpt-untiled-unpadded-keep-bigV")

_SAFE_SUM = ("the plan sums each line's own maximum (the 0.5-layer backward workspace, the loss working set) where "
             "the trace sees them at different moments; with a 320-token vocabulary these lines are a fifth of the "
             "phase, so the plan errs on the safe side")
_PREFILL = "the prefill working set of a 448-token prompt is planned above what the chunked prefill holds (safe side)"
# row -> reason (measured trace / plan per phase in the reason). Every row listed errs on the safe side: the
# optimistic ones of earlier lists (CUDA checkpointing + tiled MLP 1.16-1.37, the LoRA loss phase 1.11, CUDA LoRA
# decode 1.12) were the trace running the fused loss's fallback pass (fused._not_separable) and the decode holding
# the prefill's logits through every step (rollout/engine.py), both gone.
KNOWN_OFF = {
    "cpu-full-nockpt-untiled-shared-keep-smallV": f"generation 0.82, update 0.899: {_PREFILL}; {_SAFE_SUM}",
    "cpu-full-nockpt-tiled-shared-keep-smallV": f"generation 0.81: {_PREFILL}",
    "cpu-full-ckpt-untiled-unpadded-keep-smallV": f"update 0.89: {_SAFE_SUM}",
    "cpu-full-ckpt-tiled-unpadded-keep-smallV": f"update 0.80: {_SAFE_SUM}, the tiled MLP shard too",
    "cpu-lora-nockpt-untiled-shared-keep-smallV": f"generation 0.82, update 0.875: {_PREFILL}; {_SAFE_SUM}",
    "cpu-lora-nockpt-tiled-shared-keep-smallV": f"generation 0.74, update 0.88: {_PREFILL}; {_SAFE_SUM}",
    "cpu-lora-ckpt-untiled-unpadded-keep-smallV": f"update 0.89: {_SAFE_SUM}",
    "cpu-lora-ckpt-tiled-unpadded-keep-smallV": f"update 0.82: {_SAFE_SUM}, the tiled MLP shard too",
    "cuda-full-nockpt-untiled-shared-keep-smallV": f"generation 0.85: {_PREFILL}",
    "cuda-full-nockpt-tiled-shared-keep-smallV": f"generation 0.85: {_PREFILL}",
    "cuda-lora-nockpt-untiled-shared-keep-bigV": f"generation 0.84: {_PREFILL}",
    "cuda-lora-nockpt-tiled-shared-keep-bigV": f"generation 0.84: {_PREFILL}",
    "cuda-lora-nockpt-untiled-shared-keep-smallV": f"generation 0.78: {_PREFILL}",
    "cuda-lora-nockpt-tiled-shared-keep-smallV": f"generation 0.70: {_PREFILL}",
    "cuda-lora-ckpt-untiled-unpadded-offload-smallV": f"update 0.900 (at the edge): {_SAFE_SUM}",
}


def _config(key: str):
    device, mode, ckpt, tiled, layout, offload, _ = key.split("-")
    return from_dict(merge_overrides({}, [
        "rollout.num_generations=4", "run.batch_size=4", "loss.beta=0.04", f"run.device={device}",
        f"model.dtype={'float32' if device == 'cpu' else 'bfloat16'}", f"lora.enabled={str(mode == 'lora').lower()}",
        f"memory.gradient_checkpointing={str(ckpt == 'ckpt').lower()}",
        f"memory.tiled_mlp={'on' if tiled == 'tiled' else 'off'}",
        f"memory.offload_activations={str(offload == 'offload').lower()}", *LAYOUTS[layout]]))


def _ratios(key: str) -> dict[str, float]:
    device, shape = key.split("-")[0], SHAPES[key.split("-")[-1]]
    cfg = _config(key)
    plan = plan_memory(shape, run_spec(cfg, device, vocab=shape.vocab))
    trace = trace_config(cfg, shape, device=device)
    return {p: trace.phases[p].peak_bytes / plan_tensor_bytes(plan, p) for p in trace.phases}


def _param(key: str, slow: bool):
    marks = [pytest.mark.slow] if slow else []
    if key in KNOWN_OFF:
        marks.append(pytest.mark.xfail(reason=KNOWN_OFF[key], strict=False))
    return pytest.param(key, marks=marks, id=key)


ALL = list(_rows())
assert set(QUICK) <= set(ALL) and not set(QUICK) & set(KNOWN_OFF) and set(KNOWN_OFF) <= set(ALL)


@pytest.mark.parametrize("key", [_param(k, slow=k not in QUICK) for k in ALL])
def test_trace_agrees_with_the_plan_phase_by_phase(key):
    ratios = _ratios(key)
    assert set(ratios) == {"generation", "update"}
    off = {p: round(r, 3) for p, r in ratios.items() if not 0.9 <= r <= 1.1}
    assert not off, f"{key}: trace / plan {off}"


def test_matrix_covers_every_dimension():
    """56 rows: 2 devices x 2 modes x 2 vocabularies x (checkpointing off: 2 tiled x 2 layouts; on: 2 tiled x
    (2 offload on CUDA, 1 on CPU)); the quick rows touch every value of every dimension."""
    assert len(ALL) == 56
    for position in range(7):
        assert {k.split("-")[position] for k in QUICK} == {k.split("-")[position] for k in ALL}, position
