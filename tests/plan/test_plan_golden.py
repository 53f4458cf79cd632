"""Every plan line of 79 configurations, byte for byte, against golden_plans.json: the planner's matrix (full /
LoRA x checkpointing x tiled MLP x unpadded / shared prompt x offload x two vocabularies x CPU / CUDA) and 23 more
(PPO, FSDP2 and DDP, QLoRA, 8-bit AdamW, the reference's placements, token budgets, an int8 KV cache, the entropy
bonus, vLLM, bfloat16 updates, long CPU completions, the data's longest prompt, eager attention), with what the
plan decides for the run (the decode packing, the tiled MLP).

The file was written by the planner as it stood before the stages took their own cost rules (plan/model.py
reading forward/, loss/, update/ and rollout/costs.py): the move changed no line. A deliberate change of a
formula rewrites it (``python tests/plan/test_plan_golden.py --write``) in the same commit, which then shows
every line it moved.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from slimgrpo.config import from_dict, merge_overrides
from slimgrpo.plan.model import decode_packing, plan_memory, tiled_mlp_on
from slimgrpo.runspec.run import run_spec
from slimgrpo.runspec.shape import ModelShape, load_shape

GOLDEN = Path(__file__).with_name("golden_plans.json")

SHAPES = {
    "bigV": ModelShape("qwen2", hidden=64, intermediate=176, layers=2, heads=4, kv_heads=2, vocab=32_000, tie=True,
                       max_positions=1 << 20),
    "smallV": ModelShape("llama", hidden=128, intermediate=344, layers=2, heads=4, kv_heads=2, vocab=320, tie=False,
                         max_positions=1 << 20),
}
PRESETS = {"qwen05": "qwen2.5-0.5b", "llama8b": "llama-3.1-8b", "qwen3-8b": "qwen2.5-7b"}
LAYOUTS = {
    "unpadded": ["memory.share_prompt_forward=false", "data.max_prompt_length=24", "rollout.max_completion_length=488"],
    "shared": ["memory.share_prompt_forward=true", "data.max_prompt_length=448", "rollout.max_completion_length=64"],
}
# name -> (overrides, device, shape, processes, the data's longest prompt)
EXTRAS: dict[str, tuple[list[str], str, str, int, int | None]] = {
    "ppo-lora": (["loss.advantage_estimator=gae", "lora.enabled=true", "loss.kl_coef=0.05"], "cuda", "qwen05", 1, None),
    "ppo-full": (["loss.advantage_estimator=gae", "loss.kl_coef=0.05"], "cpu", "qwen05", 1, None),
    "fsdp4": (["distributed.strategy=fsdp", "run.batch_size=32"], "cuda", "llama8b", 4, None),
    "ddp2": (["distributed.strategy=ddp", "run.batch_size=16"], "cuda", "qwen05", 2, None),
    "qlora": (["lora.enabled=true", "model.load_in_4bit=true", "rollout.max_completion_length=4096"], "cuda",
              "llama8b", 1, None),
    "adam8": (["memory.optimizer=adamw_8bit", "loss.beta=0.04"], "cuda", "qwen05", 1, None),
    "ref-stream": (["loss.beta=0.04", "memory.reference_placement=stream"], "cuda", "qwen05", 1, None),
    "ref-device": (["loss.beta=0.04", "memory.reference_placement=device"], "cuda", "qwen05", 1, None),
    "micro-tokens": (["memory.micro_batch_tokens=2048", "run.batch_size=16"], "cuda", "qwen05", 1, None),
    "kv-int8": (["rollout.kv_cache_dtype=int8", "rollout.max_completion_length=8192"], "cuda", "qwen3-8b", 1, None),
    "entropy-adaptive": (["loss.use_adaptive_entropy=true", "loss.entropy_coef=0.01"], "cpu", "qwen05", 1, None),
    "entropy-fixed": (["loss.entropy_coef=0.01"], "cpu", "qwen05", 1, None),
    "iters2": (["loss.num_iterations=2"], "cpu", "qwen05", 1, None),
    "vocab-chunk": (["loss.vocab_chunk=32768", "loss.fuse_head_loss=false"], "cuda", "llama8b", 1, None),
    "vllm-cuda": (["rollout.engine=vllm"], "cuda", "qwen05", 1, None),
    "vllm-cpu": (["rollout.engine=vllm"], "cpu", "qwen05", 1, None),
    "bf16-update": (["model.dtype=bfloat16", "memory.bf16_update=auto"], "cuda", "qwen05", 1, None),
    "gen-rows": (["rollout.max_batch_rows=4", "run.batch_size=16"], "cpu", "qwen05", 1, None),
    "long-cpu": (["rollout.max_completion_length=8192", "model.dtype=float32"], "cpu", "qwen05", 1, None),
    "prompt-tokens": (["data.max_prompt_length=1024"], "cpu", "qwen05", 1, 300),
    "eager": (["model.attn_implementation=eager"], "cpu", "smallV", 1, None),
    "fsdp-per-layer": (["distributed.strategy=fsdp", "distributed.fsdp_generation=per_layer", "run.batch_size=16"],
                       "cuda", "qwen05", 2, None),
    "offload-8b": (["lora.enabled=true", "memory.gradient_checkpointing=true", "memory.offload_activations=true",
                    "rollout.max_completion_length=16384"], "cuda", "llama8b", 1, None),
}


def _matrix_rows():
    for device, mode, ckpt, tiled, layout, offload, vocab in itertools.product(
            ("cpu", "cuda"), ("full", "lora"), (False, True), (False, True), tuple(LAYOUTS), (False, True),
            ("bigV", "smallV")):
        if (ckpt and layout == "shared") or (offload and not (ckpt and device == "cuda")):
            continue
        key = (f"{device}-{mode}-{'ckpt' if ckpt else 'nockpt'}-{'tiled' if tiled else 'untiled'}-{layout}-"
               f"{'offload' if offload else 'keep'}-{vocab}")
        overrides = ["rollout.num_generations=4", "run.batch_size=4", "loss.beta=0.04", f"run.device={device}",
                     f"model.dtype={'float32' if device == 'cpu' else 'bfloat16'}",
                     f"lora.enabled={str(mode == 'lora').lower()}", f"memory.gradient_checkpointing={str(ckpt).lower()}",
                     f"memory.tiled_mlp={'on' if tiled else 'off'}",
                     f"memory.offload_activations={str(offload).lower()}", *LAYOUTS[layout]]
        yield key, (overrides, device, vocab, 1, None)


ROWS = dict(_matrix_rows()) | {k: (v[0] + [f"run.device={v[1]}"], *v[1:]) for k, v in EXTRAS.items()}


def _shape(key: str) -> ModelShape:
    return SHAPES[key] if key in SHAPES else load_shape(PRESETS[key])


def planned(row: str) -> dict:
    overrides, device, shape_key, processes, prompt_tokens = ROWS[row]
    shape = _shape(shape_key)
    spec = run_spec(from_dict(merge_overrides({}, overrides)), device, processes, shape.vocab, prompt_tokens)
    plan = plan_memory(shape, spec)
    return {"peak": plan.peak_bytes, "phase": plan.peak_phase, "host": plan.host_bytes,
            "lines": [[c.name, c.bytes, c.phase, c.location] for c in plan.components],
            "decode_packing": decode_packing(shape, spec), "tiled_mlp_on": tiled_mlp_on(shape, spec)}


def test_every_row_is_in_the_golden_file():
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(ROWS)


@pytest.mark.parametrize("row", sorted(ROWS))
def test_the_plan_is_the_golden_one(row):
    expected = json.loads(GOLDEN.read_text())[row]
    got = planned(row)
    moved = [f"{a} -> {b}" for a, b in zip(expected["lines"], got["lines"]) if a != b]
    assert got == expected, f"{row}: lines moved: {moved or 'their number changed'}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    rows = {row: planned(row) for row in sorted(ROWS)}
    GOLDEN.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                                         for k, v in rows.items()) + "\n}\n")
    print(f"wrote {len(rows)} plans to {GOLDEN}")
