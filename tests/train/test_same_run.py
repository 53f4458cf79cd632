"""The same seed gives the same metrics, to the last bit, as golden_runs.json: sixteen three-step runs of a tiny
Qwen2 (GRPO, LoRA, the KL with two iterations, shared prompts, unpadded rows, the separate loss path, the
adaptive entropy bonus, DAPO over two optimizer steps, PPO full and LoRA, checkpointing with micro-batches, a
token budget, RLOO, the tiled MLP, the top-entropy mask, GSPO's sequence ratio).

The file was written by the trainer as it stood before the house was rebuilt around the run spec (the planner
above the training path, the forward room, the update as one call): every metric of every step came back equal.
Float results depend on the CPU's kernels, so the comparison runs where the golden file was recorded (the same
torch build and CPU capability, one thread) and says why it skips elsewhere. A deliberate change of the numbers
rewrites the file (``python tests/train/test_same_run.py --write``) in the same commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).with_name("golden_runs.json")
TIMED = ("time", "_s", "memory", "mem", "rss", "wall", "tokens_per", "seconds", "throughput")
BASE = ["run.max_steps=3", "run.batch_size=4", "rollout.num_generations=4", "rollout.max_completion_length=12",
        "data.max_prompt_length=32", "run.seed=7", "optim.learning_rate=0.001", "run.save_steps=0",
        "log.report_to=none", "run.device=cpu", "run.num_threads=1"]
RUNS = {
    "grpo": [],
    "lora": ["lora.enabled=true", "lora.r=4"],
    "beta-iters": ["loss.beta=0.04", "loss.num_iterations=2"],
    "shared-prompt": ["memory.share_prompt_forward=true", "run.batch_size=8", "memory.micro_batch_size=8"],
    "no-share": ["memory.share_prompt_forward=false"],
    "unfused": ["loss.fuse_head_loss=false", "loss.beta=0.04"],
    "entropy-adaptive": ["loss.use_adaptive_entropy=true", "loss.entropy_coef=0.01"],
    "dapo-steps": ["loss.loss_type=dapo", "loss.steps_per_generation=2", "run.batch_size=8"],
    "ppo": ["loss.advantage_estimator=gae", "loss.kl_coef=0.05"],
    "ppo-lora": ["loss.advantage_estimator=gae", "lora.enabled=true", "lora.r=4"],
    "ckpt-micro": ["memory.gradient_checkpointing=true", "memory.micro_batch_size=2"],
    "micro-tokens": ["memory.micro_batch_tokens=64"],
    "rloo": ["loss.advantage_estimator=rloo"],
    "tiled": ["memory.tiled_mlp=on"],
    "top-entropy": ["loss.top_entropy_quantile=0.5"],
    "seq-is": ["loss.importance_sampling_level=sequence", "loss.num_iterations=2"],
}
REWARD = ("def digits(completions, answer, **kw):\n"
          "    return [float(sum(c.isdigit() for c in x)) / 10 + (1.0 if a in x else 0.0)"
          " for x, a in zip(completions, answer)]\n")


def _fingerprint() -> dict[str, str]:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def _inputs(folder: Path) -> list[str]:
    """The tiny model, the prompts and the reward function every run takes, as overrides."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tiny_models import build_tiny_model, build_tokenizer

    model = folder / "model"
    model.mkdir(parents=True, exist_ok=True)
    build_tiny_model(model, len(build_tokenizer(model, 300)), seed=0)
    rows = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "rw.py").write_text(REWARD)
    return [f"model.path={model}", f"data.path={folder / 'train.jsonl'}", f"rewards.functions=[{folder / 'rw.py'}:digits]"]


def run_metrics(name: str, folder: Path, inputs: list[str]) -> list[dict]:
    """Run ``name`` in this process; its metrics.jsonl without the timing and memory figures."""
    from slimgrpo.commands.cli import main

    out = folder / name
    settings = {a.split("=", 1)[0]: a for a in [*inputs, *BASE, f"run.output_dir={out}", *RUNS[name]]}
    threads = torch.get_num_threads()
    try:
        assert main(["train", *settings.values()]) == 0
    finally:
        torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(t in k for t in TIMED)} for r in rows]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, list[str]]:
    folder = tmp_path_factory.mktemp("same_run")
    return folder, _inputs(folder)


@pytest.mark.parametrize("name", list(RUNS))
def test_the_same_seed_gives_the_golden_metrics(name, inputs, one_thread):
    golden = json.loads(GOLDEN.read_text())
    if golden["_recorded_with"] != _fingerprint():
        pytest.skip(f"golden_runs.json was recorded with {golden['_recorded_with']}; this machine is "
                    f"{_fingerprint()}: float kernels differ")
    folder, args = inputs
    got = run_metrics(name, folder, args)
    assert len(got) == len(golden[name]) == 3
    for step, (g, want) in enumerate(zip(got, golden[name]), 1):
        moved = {k: (want.get(k), g.get(k)) for k in set(g) | set(want) if g.get(k) != want.get(k)}
        assert not moved, f"{name}, step {step}: (golden, now) {moved}"


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        args = _inputs(Path(tmp))
        rows = {name: run_metrics(name, Path(tmp), args) for name in RUNS}
    GOLDEN.write_text('{\n"_recorded_with": ' + json.dumps(_fingerprint()) + ",\n" + ",\n".join(
        f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in rows.items()) + "\n}\n")
    print(f"wrote {len(rows)} runs to {GOLDEN}")
