"""Report pieces: EMA against a naive loop, band bounds, status line, notes for metrics off by configuration,
first -> last changes, changed config keys first, conversations, several runs, the wall-time axis."""

import json
import math
from types import SimpleNamespace

import pytest
import yaml
from test_report import make_run

from slimgrpo.commands.report import report_command
from slimgrpo.report import build_report
from slimgrpo.report.data import Metrics, Series, auto_alpha, deltas, ema, run_status
from slimgrpo.report.page import _text_block
from slimgrpo.report.plots import Run, _bounds


def naive_ema(values, alpha):
    out, s, w = [], 0.0, 0.0
    for v in values:
        if v != v:
            out.append(float("nan"))
            continue
        s = alpha * v + (1 - alpha) * s
        w = alpha + (1 - alpha) * w
        out.append(s / w)
    return out


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.1])
def test_ema_matches_a_naive_debiased_average(alpha):
    vals = [math.sin(i) + (float("nan") if i % 7 == 3 else 0.0) for i in range(37)]
    got, want = ema(vals, alpha), naive_ema(vals, alpha)
    assert all((g != g and w != w) or g == pytest.approx(w) for g, w in zip(got, want))
    assert ema([5.0, 5.0, 5.0], 0.1) == pytest.approx([5.0, 5.0, 5.0])  # debiased: no pull towards 0


def test_auto_alpha_leaves_short_runs_raw():
    assert auto_alpha(30) == 1.0 and 0 < auto_alpha(450) < 0.2
    s = Series("x", list(range(10)), [float(i) for i in range(10)])
    assert s.smoothed().values == s.values


def test_band_bounds():
    mean = Series("m", [1, 2, 3], [0.2, 0.5, 0.9])
    binary = Run("r", Metrics([]), {"reward/acc": (0.0, 1.0)})
    assert _bounds(binary, "reward/acc", mean) == (0.0, 1.0)
    assert _bounds(Run("r", Metrics([]), {}), "reward/acc", mean) == (0.0, 1.0)  # means in [0, 1]
    wide = Run("r", Metrics([]), {"reward": (-2.0, 3.0)})
    assert _bounds(wide, "reward", mean) == (-2.0, 3.0)
    assert _bounds(Run("r", Metrics([]), {}), "reward", Series("m", [1, 2], [1.5, 2.5])) is None


def test_status_line():
    m = Metrics([{"step": s, "reward": 0.1} for s in (1, 2, 3)])
    cfg = {"run": {"max_steps": 3}}
    assert run_status(m, {"steps": 3}, cfg) == ("complete", "Complete: 3 of 3 steps.")
    kind, text = run_status(m, {"steps": 3, "preempted_by": "SIGTERM"}, {"run": {"max_steps": 10}})
    assert kind == "stopped" and "by SIGTERM at step 3 of 10" in text
    kind, text = run_status(m, {}, cfg)
    assert kind == "running" and "step 3 of 3" in text


def test_deltas_use_smoothed_training_metrics_and_raw_eval():
    recs = [{"step": 0, "eval/accuracy_greedy": 0.25}]
    recs += [{"step": i, "reward": float(i % 2), "rewards/acc/mean": 0.5} for i in range(1, 101)]
    recs[-1]["eval/accuracy_greedy"] = 0.75
    rows = {label: (a, b) for label, a, b in deltas(Metrics(recs))}
    assert rows["held-out accuracy, greedy"] == (0.25, 0.75)
    assert 0.3 < rows["reward (total)"][1] < 0.7  # the EMA, not the last raw value (1.0 or 0.0)
    assert rows["reward: acc"] == (0.5, 0.5)


def test_page_status_notes_headline_and_changed_keys(tmp_path):
    run = make_run(tmp_path / "run", steps=5)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["loss"]["beta"] = 0.0
    cfg["run"]["max_steps"] = 5
    cfg["data"]["path"] = "x" * 300
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 5, "eval/accuracy_greedy": 0.5, "eval/accuracy_sampled": 0.4}) + "\n")
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy_greedy": 0.25,
                                                   "eval/accuracy_sampled": 0.2}) + "\n"
                                       + (run / "metrics.jsonl").read_text())
    text = build_report(run).read_text()
    assert "Complete: 5 of 5 steps." in text
    assert "KL not computed: loss.beta=0" in text and not (run / "report" / "kl.png").exists()
    assert "greedy <b>25.0%</b> at step 0 → <b>50.0%</b> at step 5 (+25.0 points)" in text
    assert (run / "report" / "eval.png").is_file()
    changed = text.index("changed key")
    assert text.index("run.max_steps", changed) < text.index("All keys, by section")  # changed keys come first
    assert "x" * 300 in text and "table-layout:fixed" in text  # long values wrap inside fixed tables
    assert "No held-out evaluation" not in text


def test_conversation_is_rendered_message_by_message():
    convo = [{"role": "user", "content": "hi <b>"}, {"role": "assistant", "content": None,
                                                     "tool_calls": [{"name": "calc"}]},
             {"role": "tool", "content": [{"type": "text", "text": "42"}]}]
    out = _text_block(convo)
    assert out.count('class="msg ') == 3 and "hi &lt;b&gt;" in out and "calc" in out and "42" in out


def test_several_runs_and_time_axis(tmp_path, capsys, monkeypatch):
    a, b = make_run(tmp_path / "a", steps=4), make_run(tmp_path / "b", steps=6)
    cfg = yaml.safe_load((b / "config.yaml").read_text())
    cfg["optim"]["learning_rate"] = 0.5
    (b / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    assert report_command(SimpleNamespace(run_dirs=[str(a), str(b)], out=None, x="time")) == 0
    page = tmp_path / "report-compare" / "index.html"
    assert capsys.readouterr().out.strip().endswith("index.html") and page.is_file()
    text = page.read_text()
    assert "optim.learning_rate" in text and "run.output_dir" not in text.split("Config differences")[1]
    assert "training time" in text and (tmp_path / "report-compare" / "reward.png").is_file()
    with pytest.raises(ValueError, match="--out"):
        report_command(SimpleNamespace(run_dirs=[str(a)], out="x", x="step"))


def test_time_axis_is_cumulative_step_time():
    m = Metrics([{"step": 1, "time/step_s": 30.0}, {"step": 2, "time/step_s": 90.0}], x="time")
    assert m.xs == [0.5, 2.0]
