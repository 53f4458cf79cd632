"""``slimgrpo demo``: GRPO on the bundled tiny model and arithmetic task, evaluated before and after."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from slimgrpo.config import from_dict, merge_overrides, validate_config
from slimgrpo.config.paths import shown
from slimgrpo.modeling import build_policy
from slimgrpo.output.console import quiet_third_party
from slimgrpo.distributed.context import from_environment
from slimgrpo.train.build import RunInputs, build_run
from slimgrpo.train.trainer import Trainer
from slimgrpo.units import human_duration

from slimgrpo.demo import EVAL_NUM_SAMPLES, VLLM_MODEL_DIR  # noqa: E402

REWARD = "slimgrpo.demo.task:demo_accuracy"


def demo_config(output_dir: str, overrides: list[str], algorithm: str = "grpo"):
    from slimgrpo.demo import EVAL_FILE, EVAL_TEMPERATURE, MODEL_DIR, TRAIN_FILE, demo_config_dict, ppo_settings

    d = demo_config_dict()
    data: dict[str, Any] = {
        "model": {"path": str(MODEL_DIR), "dtype": "float32"},
        "data": {"path": str(TRAIN_FILE), "prompt_column": "prompt", "max_prompt_length": 16},
        "rollout": {"num_generations": d["num_generations"], "max_completion_length": d["max_completion_length"],
                    "temperature": d["temperature"]},
        "rewards": {"functions": [REWARD]},
        "loss": {"beta": d.get("beta", 0.0), "loss_type": d.get("loss_type", "dapo")},
        "optim": {"learning_rate": d["learning_rate"]},
        "run": {"output_dir": output_dir, "max_steps": d["max_steps"], "resume": "never", "device": "cpu",
                "batch_size": d["prompts_per_step"] * d["num_generations"], "save_steps": 0,
                # final/ is the better of the model before training and after it by eval/accuracy_greedy
                # (eval.steps=0: those are the two evaluations), never a model worse than the bundled one
                "keep_best": True},
        "log": {"logging_steps": 5, "log_completions_steps": 10},
        # Held-out accuracy before and after, as the build script measures it: sampled = EVAL_NUM_SAMPLES
        # completions per prompt at EVAL_TEMPERATURE (about +-1 point of noise on 200 prompts instead of +-3
        # with one sample), greedy = temperature 0.
        "eval": {"data": str(EVAL_FILE), "steps": 0, "num_samples": EVAL_NUM_SAMPLES,
                 "temperature": EVAL_TEMPERATURE, "max_prompts": None},
    }
    if algorithm == "ppo":  # a learned critic (a second copy of the tiny model + value head) and GAE
        d = ppo_settings()
        data["loss"].update(d["loss"])
        data["critic"] = d["critic"]
        data["optim"]["learning_rate"] = d["learning_rate"]
        data["run"]["max_steps"] = d["max_steps"]
    cfg = from_dict(merge_overrides(data, overrides))
    if twin_for_vllm(cfg):
        data["model"]["path"] = str(VLLM_MODEL_DIR)
        cfg = from_dict(merge_overrides(data, overrides))
    validate_config(cfg)
    return cfg, str(EVAL_FILE)


def twin_for_vllm(cfg) -> bool:
    """True when the demo should train the bundled model's vLLM twin: ``rollout.engine`` resolves to vLLM and
    ``model.path`` is the bundled model (head size 16, which vLLM's CPU attention does not take)."""
    from slimgrpo.config.sections.rollout import device_kind, resolve_engine
    from slimgrpo.demo import MODEL_DIR

    engine = resolve_engine(cfg.rollout.engine, device_kind(cfg.run.device))
    return engine == "vllm" and str(cfg.model.path) == str(MODEL_DIR)


def _claim_folder(cfg):
    """Lock the demo's run folder; an earlier run there is refused, or moved aside with run.overwrite=true."""
    from slimgrpo.checkpoint import run_folder

    out = Path(cfg.run.output_dir).expanduser().absolute()
    lock = run_folder.open_folder(out)
    try:
        _, lock = run_folder.prepare(cfg, out, lock, lambda p: p)
    except run_folder.FolderInUseError:
        lock.release()
        raise run_folder.FolderInUseError(
            f"{out} holds an earlier run (the demo never overwrites one): use --output-dir NEW_FOLDER, or "
            f"`slimgrpo demo run.overwrite=true` to move the old run aside to {out}.old-<time> (nothing is "
            "deleted)") from None
    except BaseException:
        lock.release()
        raise
    return lock


def run_demo(output_dir: str = "outputs/demo", overrides: list[str] | None = None, algorithm: str = "grpo") -> int:
    console = Console()
    t0 = time.perf_counter()
    cfg, eval_file = demo_config(output_dir, overrides or [], algorithm)
    lock = _claim_folder(cfg)  # before minutes of evaluation: refuse a used folder now
    quiet_third_party(cfg.log.verbose)
    name = "PPO (learned critic, GAE)" if cfg.ppo else "GRPO"
    console.print(f"[bold]slimgrpo demo[/bold]: {name} on a bundled tiny model, CPU, {cfg.run.max_steps} steps")
    if str(cfg.model.path) == str(VLLM_MODEL_DIR):
        console.print("rollout.engine=vllm: vLLM's CPU attention takes head sizes of 32 and up, so the demo trains "
                      "model_h32, the bundled model's twin with 2 attention heads of 32 (docs/demo.md#on-vllm)")
    policy = build_policy(cfg)
    T = cfg.eval.temperature
    # the lock already held: the trainer releases it when the run ends
    trainer = Trainer(build_run(cfg, RunInputs(from_environment(), policy=policy, run_lock=lock)))
    summary = trainer.train()  # evaluates eval.data before the first step and after the last
    n_eval = trainer.evaluator.num_prompts
    before = {m: summary[f"eval_before/accuracy_{m}"] for m in ("sampled", "greedy")}
    # "after" is the model final/ holds: the last step's, unless run.keep_best kept an earlier evaluation's
    kept = "eval_best" if "eval_best/accuracy_greedy" in summary else "eval_after"
    after = {m: summary[f"{kept}/accuracy_{m}"] for m in ("sampled", "greedy")}

    table = Table(title=f"held-out accuracy, {n_eval} prompts")
    for col in ("decoding", "before", "after", "change"):
        table.add_column(col, justify="right" if col != "decoding" else "left")
    for mode in ("sampled", "greedy"):
        label = f"sampled (T={T}, {EVAL_NUM_SAMPLES}/prompt)" if mode == "sampled" else "greedy"
        table.add_row(label, f"{before[mode]:.1%}", f"{after[mode]:.1%}",
                      f"{(after[mode] - before[mode]) * 100:+.1f} pts")
    console.print(table)
    if summary.get("final_step") not in (None, summary.get("steps")):
        where = "before training" if summary["final_step"] == 0 else f"after step {summary['final_step']}"
        console.print(f"final/ holds the model {where}: the best by {summary.get('best_metric')} "
                      f"(run.keep_best); the last step's model is in {shown(cfg.run.output_dir)}/last")
    wall = time.perf_counter() - t0
    summary.update({"eval_before": before["sampled"], "eval_after": after["sampled"],
                    "eval_before_greedy": before["greedy"], "eval_after_greedy": after["greedy"],
                    "wall_time_s": wall})
    out = Path(shown(cfg.run.output_dir))  # outputs/demo, as typed, when it lies below the working directory
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"wall time {human_duration(wall)}; metrics in {out / 'metrics.jsonl'}, summary in "
                  f"{out / 'summary.json'}\nnext: slimgrpo report {out}   (plots and samples as one HTML page); "
                  f"the trained model is in {out / 'final'}", soft_wrap=True)
    return 0
