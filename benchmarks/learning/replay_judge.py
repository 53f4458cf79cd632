"""Which model would keep_best have kept with another judge? Replayed on a learning-suite campaign's runs.

    python -m benchmarks.learning.replay_judge .bench/runs/learn_suite_keep_best --metric eval/mean_reward \
        --rerun .bench/runs/learn_suite_keep_best_reward --out .bench/runs/learn_suite_keep_best_by_reward

A keep_best run records every held-out evaluation in its metrics.jsonl, so the step any other ``eval/*`` metric
would have kept is known without training again (``slimgrpo.monitor.best``, the run's own rule and tie-break).
Training is bit-identical for a seed on the same machine, code and thread count (docs/checkpoints.md), so
where the replayed step's model was scored by the campaign (its ``final/``, or its ``last/`` with
``--score-last``) that score is the new judge's. A run whose replayed step was not scored (its checkpoint was
deleted) must be run again with the new judge: ``--rerun`` campaigns hold such runs (learn_suite.py with the
recipes judging by ``--metric``) and take precedence; the rerun's per-step rewards are compared with the
recorded run's, and any difference stops the replay. The result is a learn_suite results.json and its summary
(``--out``), each row saying where its score came from.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.learning import learn_suite, runs
from benchmarks.surface import BestSettings, BestTracker


def _last_eval(run: dict, steps: int) -> dict | None:
    """The score of a run's last-step model: its ``last/`` (``--score-last``), or its kept model when that was
    the last step's; None where it was not scored."""
    return run.get("eval_last") or (run["eval"] if run.get("final_step") == steps else None)


def replayed_step(records: list[dict], metric: str, greater_is_better: bool = True) -> tuple[int | None, float | None]:
    """The step and value keep_best judging by ``metric`` keeps, fed the run's records in order."""
    tracker = BestTracker(BestSettings(metric, greater_is_better))
    for r in records:
        if metric in r:
            tracker.observe(int(r["step"]), r)
    return tracker.step, tracker.value


def _trajectory(records: list[dict]) -> list[tuple]:
    return [(r["step"], r.get("reward"), r.get("loss")) for r in records if "reward" in r]


def replay(campaign: Path, metric: str, reruns: list[Path]) -> tuple[dict, list[str]]:
    old = json.loads((campaign / "results.json").read_text())
    again = [(p, json.loads((p / "results.json").read_text())) for p in reruns]
    out: dict = {}
    notes: list[str] = []
    for task, entry in old.items():
        if "base" not in entry:
            continue
        steps = entry["settings"]["steps"]
        new = out.setdefault(task, {"settings": {**entry["settings"], "best_metric": metric}, "base": entry["base"]})
        for key, run in entry.items():
            if not key.startswith("slimgrpo-s") or "eval" not in run:
                continue
            records = runs.steps_all(campaign / task / key)
            last = _last_eval(run, steps)
            rerun = next(((p, r[task][key]) for p, r in again if task in r and "eval" in r[task].get(key, {})), None)
            if rerun is not None:
                folder, rerun_run = rerun
                if _trajectory(runs.steps_all(folder / task / key)) != _trajectory(records):
                    raise SystemExit(f"{task} {key}: the rerun in {folder} trained differently from {campaign}: "
                                     "a replayed score would not be the rerun's model's")
                new[key] = dict(rerun_run)
                if "eval_last" not in rerun_run and last is not None:
                    new[key]["eval_last"] = last  # the same last-step model, scored by this campaign
                notes.append(f"{task} {key}: run again with {metric} ({folder.name}); same rewards step by step")
                continue
            step, value = replayed_step(records, metric)
            if step == run.get("final_step"):
                scored = run["eval"]
            elif step == steps and "eval_last" in run:
                scored = run["eval_last"]
            else:
                notes.append(f"{task} {key}: {metric} keeps step {step}, whose model was not scored: run it again")
                continue
            new[key] = {**run, "eval": scored, "final_step": step, "best_value": value, "best_metric": metric}
            new[key].pop("eval_last", None)
            if last is not None:  # the last step's model (scored twice in the table where it is the kept one)
                new[key]["eval_last"] = last
            new[key]["collapsed"] = learn_suite.collapsed(scored, entry["base"])
            notes.append(f"{task} {key}: replayed, keeps step {step}: the model scored as this campaign's "
                         f"{'final/' if step == run.get('final_step') else 'last/'}")
    for folder, r in again:  # runs (or tasks) only the reruns hold: nothing recorded to compare with
        for task, entry in r.items():
            new = out.setdefault(task, {k: v for k, v in entry.items() if not k.startswith("slimgrpo-s")})
            for key, run in entry.items():
                if key.startswith("slimgrpo-s") and "eval" in run and key not in new:
                    new[key] = dict(run)
                    last = _last_eval(run, entry["settings"]["steps"])
                    if last is not None:
                        new[key]["eval_last"] = last
                    notes.append(f"{task} {key}: run with {metric} ({folder.name}); no recorded run before it")
    return out, notes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("campaign", type=Path, help="a learn_suite campaign folder run with keep_best")
    p.add_argument("--metric", required=True, help="the judge to replay, an eval/* metric (greater is better)")
    p.add_argument("--rerun", type=Path, nargs="*", default=[], help="campaign folders run again with --metric")
    p.add_argument("--out", type=Path, default=None, help="write results.json and summary.md here")
    a = p.parse_args(argv)
    if not a.metric.startswith("eval/"):
        raise SystemExit(f"--metric {a.metric!r}: only held-out metrics (eval/...) are recorded at every judgement")
    results, notes = replay(a.campaign, a.metric, a.rerun)
    text = "\n".join(learn_suite.summary(results) + [""] + [f"- {n}" for n in notes]) + "\n"
    print(text)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "results.json").write_text(json.dumps(results, indent=1))
        (a.out / "summary.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
