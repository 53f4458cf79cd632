"""slimgrpo's PPO against TRL's last PPOTrainer (issue 24's memory anchor): peak RSS and s/step.

    python benchmarks/ppo_vs_trl.py --trl-path /tmp/trl112 [--layers 2] [--steps 3] [--length 64] [--cap 12GiB]

TRL 1.16 has no PPO trainer; the newest release with one is TRL 1.12.0 (``trl.experimental.ppo``). Install it
apart from the project's environment, e.g. ``pip install --no-deps --target /tmp/trl112 trl==1.12.0`` (its
requirements, transformers / accelerate / datasets, are the project's), and pass that folder as ``--trl-path``:
only TRL's child process sees it.

The workload: a random-init model of the Qwen2.5-0.5B widths and vocabulary (151,936) with ``--layers``
decoder layers (24 = the real depth), fp32, CPU; 4 prompts a step, one completion each, ``--length`` tokens
(slimgrpo pinned with min_completion_length; TRL's random policy almost never samples EOS in 152K tokens), one
PPO epoch over one mini-batch, kl_coef 0.05. TRL holds its four models (policy, reference, reward model and
value model, each a model of this shape; policy and value with AdamW); slimgrpo's reward is a function (no
reward model), its LoRA PPO keeps one base with two adapters, its full PPO a policy, a critic and a reference.
Runs: ``trl`` (full fine-tuning, TRL's way), ``ppo-lora``, ``ppo-full``, ``grpo-lora`` (4 prompts x 4
completions); each in its own process under a memory cap, peak RSS from outside, the plan next to slimgrpo's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import common  # noqa: E402

PROMPTS_PER_STEP = 4


def _spec(a, model: str, prompts: str, out: Path) -> dict:
    return {"model": model, "prompts": prompts, "steps": a.steps, "length": a.length, "out": str(out),
            "threads": a.threads}


# ----------------------------------------------------------------------------- children


def trl_child(spec: dict) -> None:
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedTokenizerFast
    from transformers import TrainerCallback
    from trl.experimental.ppo import PPOConfig, PPOTrainer
    import trl

    torch.set_num_threads(spec["threads"])
    tok = PreTrainedTokenizerFast.from_pretrained(spec["model"])
    tok.padding_side = "left"
    ds = load_dataset("json", data_files=spec["prompts"], split="train")
    ds = ds.map(lambda r: {"input_ids": tok(r["prompt"])["input_ids"]}, remove_columns=ds.column_names)
    args = PPOConfig(output_dir=spec["out"], per_device_train_batch_size=PROMPTS_PER_STEP,
                     gradient_accumulation_steps=1, num_mini_batches=1, num_ppo_epochs=1,
                     total_episodes=PROMPTS_PER_STEP * spec["steps"], response_length=spec["length"],
                     local_rollout_forward_batch_size=PROMPTS_PER_STEP, kl_coef=0.05, learning_rate=1e-6,
                     num_sample_generations=0, use_cpu=True, report_to="none", save_strategy="no",
                     logging_steps=1, disable_tqdm=True, bf16=False, fp16=False, seed=0)
    load = dict(dtype=torch.float32)
    policy = AutoModelForCausalLM.from_pretrained(spec["model"], **load)
    ref = AutoModelForCausalLM.from_pretrained(spec["model"], **load)
    reward = AutoModelForSequenceClassification.from_pretrained(spec["model"], num_labels=1, **load)
    value = AutoModelForSequenceClassification.from_pretrained(spec["model"], num_labels=1, **load)
    for m in (policy, ref, reward, value):
        m.config.pad_token_id = tok.pad_token_id
    marks = []

    class Timer(TrainerCallback):
        def on_train_begin(self, *a, **k):
            marks.append(time.perf_counter())

        def on_step_end(self, *a, **k):
            marks.append(time.perf_counter())

    trainer = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=ref, reward_model=reward,
                         value_model=value, train_dataset=ds, callbacks=[Timer()])
    trainer.train()
    steps = [b - a for a, b in zip(marks, marks[1:])]
    common.emit({"event": "end", "trainer": f"trl {trl.__version__}", "step_s": steps})


def slimgrpo_config(spec: dict):
    """The slimgrpo run of ``spec["mode"]``: ppo-lora, ppo-full or grpo-lora."""
    from slimgrpo.config import from_dict, validate_config

    ppo, lora = spec["mode"].startswith("ppo"), spec["mode"].endswith("lora")
    G = 1 if ppo else 4
    L = spec["length"]
    cfg = from_dict({
        "model": {"path": spec["model"], "dtype": "float32"},
        "lora": {"enabled": lora, "r": 16, "alpha": 32.0, "dropout": 0.0},
        "data": {"path": spec["prompts"], "prompt_column": "prompt", "shuffle": False, "use_chat_template": "never"},
        "rollout": {"num_generations": G, "max_completion_length": L, "min_completion_length": L},
        "rewards": {"functions": [f"{HERE / '_rewards.py'}:digit_reward"]},
        "loss": ({"advantage_estimator": "gae", "kl_coef": 0.05, "beta": 0.0} if ppo else {"beta": 0.04}),
        "optim": {"learning_rate": 1e-6},
        "run": {"output_dir": spec["out"], "max_steps": spec["steps"], "batch_size": PROMPTS_PER_STEP * G,
                "device": "cpu", "num_threads": spec["threads"], "save_model": False, "resume": "never",
                "save_steps": 0, "save_checkpoints": False},
        "log": {"progress": False, "log_completions_steps": 0},
    })
    validate_config(cfg)
    return cfg


def slimgrpo_child(spec: dict) -> None:
    import slimgrpo  # noqa: F401  (before torch, as the CLI)
    from slimgrpo.train.trainer import Trainer

    marks = []
    trainer = Trainer(slimgrpo_config(spec), callbacks=[lambda t, step, m: marks.append(m["time/step_s"])])
    trainer.train()
    common.emit({"event": "end", "trainer": spec["mode"], "step_s": marks})


# ----------------------------------------------------------------------------- harness


def plan_gib(spec: dict) -> float:
    """slimgrpo's plan of the run (the one ``slimgrpo train`` prints before it starts)."""
    from slimgrpo.spec.run import run_spec
    from slimgrpo.plan.admission import shape_of
    from slimgrpo.plan.model import plan_memory

    cfg = slimgrpo_config(spec)
    shape = shape_of(cfg)
    return plan_memory(shape, run_spec(cfg, "cpu", vocab=shape.vocab)).peak_bytes / 2**30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--trl-path", help="folder holding TRL 1.12 (pip install --no-deps --target DIR trl==1.12.0)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers of the Qwen2.5-0.5B-wide model (24 = real)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--length", type=int, default=64, help="completion tokens")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cap", default="12GiB", help="memory cap per run")
    p.add_argument("--runs", default="trl,ppo-lora,ppo-full,grpo-lora")
    a = p.parse_args()
    if a.child:
        spec = json.loads(Path(a.spec).read_text())
        (trl_child if a.child == "trl" else slimgrpo_child)(spec)
        return 0
    shape = dict(common.load_shape("qwen2.5-0.5b"), layers=a.layers)
    model = str(common.build_model_folder(shape, dtype="float32"))
    prompts = str(common.write_prompts(common.BENCH_DIR / "prompts" / "ppo_prompts.jsonl",
                                       PROMPTS_PER_STEP * a.steps))
    cap = common.choose_memory_cap(common.parse_size(a.cap))
    root = common.BENCH_DIR / "ppo_vs_trl" / time.strftime("%Y%m%d-%H%M%S")
    rows = []
    for mode in a.runs.split(","):
        out = root / mode
        out.mkdir(parents=True, exist_ok=True)
        spec = dict(_spec(a, model, prompts, out / "run"), mode=mode)
        (out / "spec.json").write_text(json.dumps(spec))
        env = dict(os.environ)
        if mode == "trl":
            if not a.trl_path:
                sys.exit("--trl-path is needed for the trl run")
            env["PYTHONPATH"] = os.pathsep.join([a.trl_path, env.get("PYTHONPATH", "")])
        child = "trl" if mode == "trl" else "slimgrpo"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", child, "--spec", str(out / "spec.json")]
        res = common.run_measured(cmd, out / "log.txt", cap, f"ppo-{mode}", env=env, timeout_s=1800)
        end = next((r for r in res.records if r.get("event") == "end"), {})
        steps = end.get("step_s") or []
        warm = steps[1:] or steps
        row = {"run": mode, "trainer": end.get("trainer"), "ok": res.returncode == 0,
               "peak_rss_mib": res.peak_rss_mib, "s_per_step": sorted(warm)[len(warm) // 2] if warm else None,
               "plan_gib": None if mode == "trl" else round(plan_gib(spec), 2),
               "error": res.error}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (root / "results.json").write_text(json.dumps(rows, indent=2))
    print("\n| run | peak RSS (MiB) | plan (MiB) | s/step | vs TRL peak |\n|---|---:|---:|---:|---:|")
    trl_peak = next((r["peak_rss_mib"] for r in rows if r["run"] == "trl" and r["ok"]), None)
    for r in rows:
        ratio = f"{r['peak_rss_mib'] / trl_peak:.2f}x" if trl_peak and r["peak_rss_mib"] and r["ok"] else ""
        plan = f"{r['plan_gib'] * 1024:,.0f}" if r["plan_gib"] else ""
        peak = f"{r['peak_rss_mib']:,.0f}" if r["peak_rss_mib"] else "?"
        sps = f"{r['s_per_step']:.1f}" if r["s_per_step"] else ("failed: " + r["error"][:60] if not r["ok"] else "")
        print(f"| {r['run']} | {peak} | {plan} | {sps} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
