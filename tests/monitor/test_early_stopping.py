"""run.early_stopping_patience (TRL's EarlyStoppingCallback): the run stops after that many judgements without
improvement, final/ is the best model, exit 0 with a clear line, a second start says it already finished;
TRL's names map onto the run.* keys."""

from __future__ import annotations

import json
import logging

import pytest
from run_helpers import cli
from test_keep_best import _config, _same, _steps, _train, _weights

from slimgrpo.trl import convert


def test_the_run_stops_when_the_metric_stops_improving(tmp_path, tiny_model_dir, caplog):
    cfg = _config(tmp_path, tiny_model_dir, max_steps=8, early_stopping_patience=2, save_total_limit=2)
    values = {0: 0.3, 1: 0.5, 2: 0.4, 3: 0.45, 4: 0.9, 5: 0.9, 6: 0.9, 7: 0.9, 8: 0.9}
    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        trainer, summary = _train(cfg, values)
    run = tmp_path / "run"
    assert summary["steps"] == 3 and summary["stopped_by"] == "early_stopping"  # 2 judgements without gain
    assert (summary["best_step"], summary["best_value"], summary["final_step"]) == (1, 0.5, 1)
    assert "early stopping: eval/accuracy_greedy has not improved for 2 judgement(s)" in caplog.text
    assert _same(_weights(run / "final"), _weights(run / "checkpoints" / "checkpoint-1" / "model"))
    records = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert [records[s]["early_stopping/wait"] for s in (0, 1, 2, 3)] == [0, 0, 1, 2]
    assert records[3]["early_stopping/stopped"] == 1 and "early_stopping/stopped" not in records[2]
    assert _steps(run) == [1, 3]


def test_threshold_sets_what_counts_as_improvement(tmp_path, tiny_model_dir):
    """TRL: the best follows any gain, the patience only a gain above the threshold."""
    cfg = _config(tmp_path, tiny_model_dir, max_steps=8, early_stopping_patience=2, early_stopping_threshold=0.05)
    trainer, summary = _train(cfg, {0: 0.30, 1: 0.32, 2: 0.34, 3: 0.1, 4: 0.1, 5: 0.1, 6: 0.1, 7: 0.1, 8: 0.1})
    assert summary["steps"] == 2 and summary["best_step"] == 2


def test_exit_code_line_and_a_second_start(tmp_path, tiny_model_dir):
    """Through the CLI with the real evaluation: a threshold nothing can beat stops it after `patience`
    evaluations; exit 0, the terminal says why and which model final/ is; the same command again trains
    nothing."""
    cfg = _config(tmp_path, tiny_model_dir, max_steps=6, early_stopping_patience=2, early_stopping_threshold=10.0)
    path = tmp_path / "cfg.yaml"
    proc = cli("train", str(path), "run.early_stopping_patience=2", "run.early_stopping_threshold=10",
               "run.keep_best=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "early stopping: eval/accuracy_greedy has not improved by more than 10" in out
    assert "stopped at step 2 of 6" in out and "early stopping, eval/accuracy_greedy stopped improving" in out
    assert "stopped early (a callback asked)" not in out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped_by"] == "early_stopping" and summary["steps"] == 2
    assert summary["final_step"] == summary["best_step"]
    again = cli("train", str(path), "run.early_stopping_patience=2", "run.early_stopping_threshold=10",
                "run.keep_best=true")
    assert again.returncode == 0 and "already finished: early stopping stopped it at step 2" in again.stderr
    assert cfg.run.max_steps == 6


@pytest.mark.parametrize("trl, expected", [
    ({"load_best_model_at_end": True, "metric_for_best_model": "eval_reward", "greater_is_better": True,
      "early_stopping_patience": 3, "early_stopping_threshold": 0.01},
     {"run.keep_best": True, "run.best_metric": "eval/mean_reward", "run.greater_is_better": True,
      "run.early_stopping_patience": 3, "run.early_stopping_threshold": 0.01}),
    ({"load_best_model_at_end": True, "metric_for_best_model": "rewards/accuracy/mean"},
     {"run.keep_best": True, "run.best_metric": "eval/rewards/accuracy"}),
    ({"metric_for_best_model": "eval/accuracy_greedy", "greater_is_better": None},
     {"run.best_metric": "eval/accuracy_greedy"}),
])
def test_trl_names_map(trl, expected):
    result = convert(trl)
    assert not result.refused, result.refused
    for key, value in expected.items():
        assert result.values[key] == value, key
    assert "run.best_metric" in expected or "run.best_metric" not in result.values


def test_trl_eval_loss_is_refused_naming_what_exists():
    result = convert({"load_best_model_at_end": True, "metric_for_best_model": "eval_loss"})
    (row,) = result.refused
    assert row.key == "metric_for_best_model" and "eval/accuracy_greedy" in row.detail and "no eval loss" in row.detail


# ----------------------------------------------------------------------------- the stall watch names a slide


def test_a_slide_is_named_when_entropy_collapses_while_the_reward_falls():
    from test_stall import run, step

    from slimgrpo.monitor.stall import SLIDE

    start = [step(reward=0.8, entropy=1.0)] * 3
    sliding = [step(reward=r, entropy=0.1, zero_std=0.5) for r in (0.8, 0.6, 0.4, 0.2, 0.1)]
    detector, verdicts = run(start + sliding)
    (stall,) = detector.stalls
    assert (stall.kind, stall.start_step, stall.detected_step) == (SLIDE, 4, 7)
    assert stall.message.startswith("step 7: the run is sliding since step 4")
    assert "the mean reward fell from 0.7 to 0.3" in stall.message and "run.keep_best=true" in stall.message
    assert verdicts[6].fields["stall/kind"] == SLIDE


def test_a_slide_of_the_held_out_metric_alone_is_named_too():
    from test_stall import run, step

    from slimgrpo.monitor.stall import SLIDE

    start = [step(reward=0.3, entropy=1.0)] * 3
    rising = [step(reward=0.3 + 0.1 * i, entropy=0.1, zero_std=0.5, **({"eval/accuracy_greedy": acc} if acc else {}))
              for i, acc in enumerate((0.6, None, 0.3, None))]
    detector, _ = run(start + rising)
    (stall,) = detector.stalls
    assert stall.kind == SLIDE and "the held-out metric went 0.6 -> 0.3" in stall.message
    assert "mean reward fell" not in stall.message
    # without the held-out drop the same climbing reward is no stall (test_stall's rule stays)
    climbing = [step(reward=0.3 + 0.1 * i, entropy=0.1, zero_std=0.5) for i in range(4)]
    assert run(start + climbing)[0].stalls == []


# ----------------------------------------------------------------------------- the report


def _stopped_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = []
    for s, acc in enumerate((0.3, 0.5, 0.4, 0.45)):
        r = {"step": s, "eval/accuracy_greedy": acc, "best/step": 1 if s else 0, "best/value": 0.5 if s else 0.3,
             "best/improved": int(s <= 1), "early_stopping/wait": max(0, s - 1)}
        if s:
            r.update({"reward": 0.2 * s, "reward_std": 0.1})
        if s == 3:
            r["early_stopping/stopped"] = 1
        records.append(r)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": 3, "stopped_by": "early_stopping", "early_stopping_patience": 2, "best_metric":
               "eval/accuracy_greedy", "best_step": 1, "best_value": 0.5, "final_step": 1}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "config.yaml").write_text("run: {max_steps: 8, keep_best: true}\neval: {data: x.jsonl}\n")
    return run, records, summary


def test_the_report_names_the_best_step_and_shades_the_stretch(tmp_path):
    from slimgrpo.report import build_report
    from slimgrpo.report.data import Metrics, best_step, early_stop_span, run_status

    run, records, summary = _stopped_run(tmp_path)
    m = Metrics(records)
    assert best_step(m) == (1, 0.5) and early_stop_span(m) == (1, 3)
    kind, text = run_status(m, summary, {"run": {"max_steps": 8}})
    assert kind == "stopped" and text == (
        "Stopped early at step 3 of 8: eval/accuracy_greedy stopped improving (run.early_stopping_patience=2). "
        "final/ is the best model by eval/accuracy_greedy = 0.5: step 1; the last step's model is in last/.")
    page = build_report(run).read_text()
    assert "Stopped early at step 3 of 8" in page and "Dashed: the step whose model final/ holds" in page
    assert (run / "report" / "eval.png").is_file()
    done = {**summary, "steps": 8, "final_step": 8, "stopped_by": None}
    assert run_status(m, done, {"run": {"max_steps": 8}})[1].endswith("step 8 (the last step's; run.keep_best).")
