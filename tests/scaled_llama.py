"""A scaled-down Llama and the settings of Unsloth's 8B x 20K anchor scaled down with it, shared by the trace's and
the planner's tests (tests/trace/test_trace_device.py, tests/plan/test_tiled_mlp_plan.py): widths that divide no
chunk size, a completion long enough for the KV cache and the checkpoints to dominate as they do at full size."""

from slimgrpo.runspec.shape import ModelShape

# Hidden 256, MLP 688 (no power of two), 8 query / 4 KV heads of 32, 4 layers, untied 1,000-token head.
SHAPE = ModelShape("llama", hidden=256, intermediate=688, layers=4, heads=8, kv_heads=4, vocab=1000, tie=False,
                   max_positions=1 << 20)
# Unsloth's anchor (benchmarks/planner/trace_anchors.py UNSLOTH), scaled down: checkpointing, one row per
# micro-batch, a long pinned completion, beta 0.
BASE = ["model.dtype=bfloat16", "run.device=cuda", "lora.enabled=true", "memory.gradient_checkpointing=true",
        "memory.micro_batch_size=1", "rollout.num_generations=2", "run.batch_size=2", "data.max_prompt_length=37",
        "rollout.max_completion_length=3001", "rollout.min_completion_length=3001", "loss.beta=0",
        "loss.token_chunk=256"]
