"""Shared pieces of the learning benchmarks (learn_vs_trl.py, learn_suite.py, bf16_learn.py): a recipe's data,
one ``slimgrpo train`` and one TRL run measured from outside, and held-out scoring by ``slimgrpo eval``.

A recipe is a slimgrpo YAML beside a Python module of the same name (its data maker and rewards, TRL's
reward contract), like examples/smollm2_addition.yaml / .py.

TRL's settings come one of two ways:

- ``matched``: learn_vs_trl.py's spec, where the TRL child (children/trl_grpo.py) pins slimgrpo's values for
  what the recipe does not say (AdamW betas (0.9, 0.99), a constant schedule, ...), so both trainers run the
  same settings;
- ``own defaults`` (``trl_own_defaults``): **every key the recipe sets is passed to TRL under its GRPOConfig
  name, and nothing else**, so TRL runs its own GRPOConfig defaults wherever the recipe is silent (adam_beta2
  0.999, a linear schedule, ...), as slimgrpo runs its own: each trainer as its users run it. The slimgrpo key
  -> GRPOConfig field table is slimgrpo's own TRL table (slimgrpo.config.trl_table: the plain one-to-one rules,
  reversed) plus the few keys below whose value changes form; a recipe key in neither is an error.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from benchmarks.harness.measure import run_measured
from benchmarks.harness.memcap import choose_memory_cap
from benchmarks.harness.processes import child_command, child_env, module_command
from benchmarks.harness.records import read_jsonl

EVAL_SEED = 1234

# Recipe keys that say nothing about TRL's training: where things are (the harness passes the model, the data
# file and the reward functions itself), what is logged or saved, and the thread count (the harness's).
NOT_TRAINING = ("model.path", "data.path", "data.prompt_column", "rewards.functions", "run.output_dir",
                "run.save_steps", "run.num_threads", "log.")
# Recipe keys TRL 1.16 has no setting for, left out of its config: it never cuts prompts (a limit on prompt
# length that a prompt shorter than it never meets changes nothing).
NO_TRL_SETTING = ("data.max_prompt_length",)
# Recipe keys for slimgrpo's held-out evaluation during training and the model it keeps (run.keep_best, early
# stopping): left out of TRL's config, so TRL's runs stay as before (the final model is the last step's).
KEEP_BEST_KEYS = ("run.keep_best", "run.best_metric", "run.greater_is_better", "run.early_stopping_patience",
                  "run.early_stopping_threshold", "run.save_total_limit")
VAL_PROMPTS = 32  # the validation prompts keep_best judges by: the last rows of train.jsonl (never the scored ones)


def pending_runs(results: dict, seeds: list[int], trainers: list[str]):
    """``(seed, trainer, key)`` of a campaign's runs not yet evaluated (``key`` = ``{trainer}-s{seed}``):
    a campaign that was stopped resumes where it left off."""
    for seed in seeds:
        for trainer in trainers:
            key = f"{trainer}-s{seed}"
            if not (key in results and "eval" in results[key]):
                yield seed, trainer, key


def load_recipe(path: Path) -> dict:
    import yaml

    return yaml.safe_load(Path(path).read_text())


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_data(recipe_code: Path, data_dir: Path) -> tuple[Path, Path]:
    """The recipe's fixed train / held-out files in ``data_dir``, by the recipe's own data maker (it leaves files
    already there alone: the split is fixed, so a resumed campaign reads the same questions)."""
    load_module(recipe_code).main(["--make-data", str(data_dir)])
    return data_dir / "train.jsonl", data_dir / "heldout.jsonl"


def slimgrpo_cmd(*args: str) -> list[str]:
    return module_command("slimgrpo", *args)


def accuracy_of(data: dict) -> float:
    """The accuracy of the one model in a ``slimgrpo eval --json`` file (``{model: {"accuracy": ...}}``)."""
    return float(next(iter(data.values()))["accuracy"])


def evaluate(recipe: Path, model: Path, heldout: Path, out: Path, threads: int, samples: int = 4,
             limit: int | None = None) -> dict:
    """Held-out accuracy of ``model`` by ``slimgrpo eval`` with the recipe's rewards: ``samples`` completions
    per prompt at the recipe's temperature ("sampled"), and one greedy ("greedy")."""
    result = {}
    for label, extra in (("sampled", []), ("greedy", ["rollout.temperature=0"])):
        path = out.with_name(f"{out.stem}-{label}.json")
        overrides = [f"model.path={model}", f"run.seed={EVAL_SEED}", f"run.num_threads={threads}", *extra]
        cmd = slimgrpo_cmd("eval", str(recipe), *overrides, "--data", str(heldout), "--json", str(path),
                           "--num-samples", str(samples) if label == "sampled" else "1")
        if limit:
            cmd += ["--limit", str(limit)]
        run = run_measured(cmd, out.with_name(f"{out.stem}-{label}.log"), choose_memory_cap(None), f"eval-{label}")
        if run.returncode != 0:
            raise SystemExit(f"eval of {model} failed ({run.error}); log: {run.log_path}")
        data = json.loads(path.read_text())
        result[label] = data
        result[f"{label}_accuracy"] = accuracy_of(data)
    return result


def validation_file(train: Path) -> Path:
    """``val.jsonl`` beside ``train``: its last ``VAL_PROMPTS`` rows. run.keep_best judges by them, so the
    held-out questions the suite scores never choose the model (they would flatter it)."""
    val = train.with_name("val.jsonl")
    if not val.is_file():
        rows = [line for line in train.read_text().splitlines() if line.strip()]
        val.write_text("\n".join(rows[-VAL_PROMPTS:]) + "\n")
    return val


def keep_best_overrides(train: Path, keep_best: bool) -> list[str]:
    """On: judged on ``validation_file(train)``, the newest checkpoint beside the best. Off: no held-out
    evaluation, no judge and no checkpoints (the recipe's run.best_metric cleared: nothing to judge by)."""
    if keep_best:
        return [f"eval.data={validation_file(train)}", "run.save_total_limit=1"]
    return ["run.keep_best=false", "run.best_metric=", "eval.data=", "run.save_checkpoints=false"]


def train_slimgrpo(recipe: Path, seed: int, model: Path, steps: int, threads: int, train: Path, run_dir: Path,
                   log: Path, keep_best: bool = False) -> dict:
    """``slimgrpo train RECIPE`` as a user runs it (the recipe's settings, slimgrpo's defaults elsewhere), with
    the model, data, output folder, seed, steps and threads set by the harness. Wall time and peak RSS from
    outside; the reward curve from metrics.jsonl. ``keep_best``: the recipe's run.keep_best with its eval.*
    settings, judged on ``validation_file(train)``; the newest checkpoint and the best one are on disk until
    the run is scored (``drop_checkpoints``). Off: no held-out evaluation and no checkpoints at all (only the
    final model is scored; a checkpoint is 1.6 GB)."""
    cmd = slimgrpo_cmd("train", str(recipe), f"model.path={model}", f"data.path={train}",
                       f"run.output_dir={run_dir}", f"run.seed={seed}", f"run.max_steps={steps}",
                       f"run.num_threads={threads}", "log.progress=false", "log.log_completions_steps=0",
                       *keep_best_overrides(train, keep_best))
    run = run_measured(cmd, log, choose_memory_cap(None), "slimgrpo")
    if run.returncode != 0:
        raise SystemExit(f"slimgrpo seed {seed} failed ({run.error}); log: {run.log_path}")
    records = steps_all(run_dir)
    steps_ = [s for s in records if "reward" in s and "step" in s]
    curve = [{"step": s["step"], "reward": s["reward"],
              **{k: v for k, v in s.items() if k.startswith("rewards/") and k.endswith("/mean")}} for s in steps_]
    out = {"wall_s": run.wall_s, "peak_rss_mib": run.peak_rss_mib, "curve": curve, "model": str(run_dir / "final")}
    summary = json.loads((run_dir / "summary.json").read_text()) if (run_dir / "summary.json").is_file() else {}
    for key in ("best_metric", "best_step", "best_value", "final_step", "stopped_by"):
        if key in summary:
            out[key] = summary[key]
    out["eval_s"] = sum(s.get("time/eval_s", 0.0) for s in records)  # held-out evaluation's share
    return out


def steps_all(run_dir: Path) -> list[dict]:
    """Every record of a run's metrics.jsonl."""
    return read_jsonl(run_dir / "metrics.jsonl")


def drop_checkpoints(run_dir: Path) -> None:
    """A scored run's checkpoints (1.6 GB each for SmolLM2): final/ and last/ stay."""
    import shutil

    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def reward_specs(recipe_path: Path, recipe: dict) -> list[str]:
    """The recipe's reward functions with their files made absolute (relative to the recipe's folder)."""
    base = Path(recipe_path).parent
    return [str((base / f.split(":")[0]).resolve()) + ":" + f.split(":")[1] for f in recipe["rewards"]["functions"]]


def run_trl(spec: dict, spec_path: Path, log: Path, seed: int) -> dict:
    """One TRL GRPOTrainer run through its child (children/trl_grpo.py; its model saved to ``spec["save_dir"]``)."""
    spec_path.write_text(json.dumps(spec, indent=1))
    run = run_measured(child_command("trl_grpo", spec_path), log, choose_memory_cap(None), "trl", env=child_env())
    if run.returncode != 0:
        raise SystemExit(f"TRL seed {seed} failed ({run.error}); log: {run.log_path}")
    steps = [rec for rec in run.records if rec.get("event") == "step"]
    curve = [{"step": s["step"], "reward": s.get("reward"),
              **{k: v for k, v in s.items() if k.startswith("rewards/")}} for s in steps]
    return {"wall_s": run.wall_s, "peak_rss_mib": run.peak_rss_mib, "curve": curve, "model": spec["save_dir"]}


# ----------------------------------------------------------------------------- TRL with its own defaults


def _flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def trl_names() -> dict[str, str]:
    """slimgrpo key -> GRPOConfig field for the keys whose value TRL takes unchanged: slimgrpo's own TRL table
    (config/trl_table.py's RULES) reversed, where a TRL key maps to one slimgrpo key with no change of value."""
    from benchmarks.surface import RULES

    names: dict[str, str] = {}
    for rule in RULES:
        if rule.kind == "map" and rule.transform is None and len(rule.targets) == 1:
            names.setdefault(rule.targets[0], rule.key)
    return names


def _special(key: str, value) -> dict | None:
    """Recipe keys whose TRL form differs (None: not one of them)."""
    if key == "model.dtype":  # weights loaded in this dtype; TRL's bf16 (autocast, on by default) only for bf16
        return {"model_init_kwargs": {"dtype": value}, "bf16": value == "bfloat16", "fp16": value == "float16"}
    if key == "run.batch_size":  # rows per optimizer step = one generation batch, as in slimgrpo
        return {"per_device_train_batch_size": int(value), "gradient_accumulation_steps": 1}
    if key in ("run.max_steps", "optim.lr_scheduler_type", "loss.scale_rewards", "rollout.min_p"):
        return {key.split(".")[1]: value}  # same name, same values in both
    return None


def trl_own_defaults(recipe: dict, overrides: dict) -> dict:
    """GRPOConfig keyword arguments for a recipe: the keys it sets (``overrides``, dotted, win over the file's)
    under their TRL names, nothing else, so TRL's own defaults hold wherever the recipe is silent."""
    settings = {**_flatten(recipe), **overrides}
    names = trl_names()
    kwargs: dict = {}
    for key, value in settings.items():
        if (key in NOT_TRAINING or key in NO_TRL_SETTING or key in KEEP_BEST_KEYS or key.startswith("log.")
                or key.startswith("eval.")):
            continue
        special = _special(key, value)
        if special is not None:
            kwargs.update(special)
        elif key in names:
            kwargs[names[key]] = value
        else:
            raise ValueError(f"recipe key {key!r} has no TRL GRPOConfig equivalent in the suite's table "
                             f"(benchmarks/learning/runs.py); add it there or drop it from the recipe")
    return kwargs


def trl_spec(recipe_path: Path, recipe: dict, model: Path, train: Path, seed: int, steps: int, threads: int,
             out_dir: Path) -> dict:
    """A TRL child's spec that runs the recipe in TRL with TRL's own defaults where the recipe is silent."""
    grpo = trl_own_defaults(recipe, {"run.seed": seed, "run.max_steps": steps})
    return {"model_path": str(model), "prompts_path": str(train), "rewards": reward_specs(recipe_path, recipe),
            "device": "cpu", "num_threads": threads, "output_dir": str(out_dir), "save_dir": str(out_dir / "final"),
            "grpo_config": grpo}
