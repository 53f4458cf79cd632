"""Issue 34's small items in what a run shows: the PPO step line has the critic's numbers; the report draws a
constant series as one clear value, formats first/last values and changes with sensible digits in one format
for every reward, shades and lists the steps where learning stalled; a single model path keeps a useful name
as a column header."""

from __future__ import annotations

import json
import math

from slimgrpo.report import build_report
from slimgrpo.report.data import Metrics, run_status, stalls
from slimgrpo.report.page import deltas_table, pair_text, signed
from slimgrpo.report.plots import new_figure, steady_axis
from slimgrpo.output.metrics import console_line
from slimgrpo.units import column_labels


def test_the_ppo_step_line_shows_value_loss_and_explained_variance():
    line = console_line(3, {"reward": 0.5, "value/loss": 0.01234, "value/explained_variance": 0.4567})
    assert "vloss 0.0123" in line and "ev 0.46" in line
    assert "vloss" not in console_line(3, {"reward": 0.5})  # GRPO: no critic, nothing shown


def test_a_constant_learning_rate_is_one_clear_value():
    fig, (ax,) = new_figure()
    ax.plot([1, 2, 3], [3e-4, 3e-4, 3e-4])
    steady_axis(ax)
    assert list(ax.get_yticks()) == [3e-4] and [t.get_text() for t in ax.get_yticklabels()] == ["0.0003"]
    lo, hi = ax.get_ylim()
    assert math.isclose(lo, 1.5e-4) and math.isclose(hi, 4.5e-4)
    fig, (ax,) = new_figure()
    ax.plot([1, 2, 3], [1e-4, 2e-4, 3e-4])  # a schedule: matplotlib's own ticks
    steady_axis(ax)
    assert len(ax.get_yticks()) > 1


def test_changes_have_two_significant_digits_and_rewards_one_format():
    assert signed(0.07524) == "+0.075" and signed(-12.34) == "-12" and signed(0.5) == "+0.50"
    assert signed(1.2e-5) == "+1.2e-05" and signed(0.0) == "0"
    # two accuracy-like rewards read alike (numbers, same decimals), shares stay percentages
    assert pair_text("reward: demo_accuracy", 0.273, 0.65) == ("0.273", "0.650")
    assert pair_text("reward: correct", 0.0, 0.25) == ("0.000", "0.250")
    assert pair_text("held-out accuracy, greedy", 0.535, 0.825) == ("53.5%", "82.5%")
    assert pair_text("reward (total)", 12.0, 145.25) == ("12", "145")
    records = [{"step": s, "reward": 0.5 + 0.07524 * (s - 1), "rewards/demo_accuracy/mean": 0.273 + 0.1 * (s - 1),
                "rewards/correct/mean": 0.125 * (s - 1)} for s in (1, 2, 3)]
    html = deltas_table(Metrics(records))
    assert "+0.15" in html and "0.07524" not in html and "+0.1504" not in html
    assert "%" not in html  # no reward row is shown as a percentage


def stalled_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    records = []
    for s in range(1, 9):
        r = {"step": s, "reward": min(1.0, 0.2 * s), "reward_std": 0.3, "learning_rate": 3e-4,
             "frac_reward_zero_std": 1.0 if s >= 4 else 0.25, "time/step_s": 1.0}
        if s >= 6:
            r.update({"stall/start_step": 4, "stall/steps": s - 3})
        if s == 6:
            r.update({"stall/detected": 1, "stall/kind": "no_signal", "stall/reason": "step 6: learning has stalled"})
        records.append(r)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_the_report_shades_and_lists_the_stalled_steps(tmp_path):
    run = stalled_run(tmp_path)
    m = Metrics([json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()])
    assert stalls(m) == [(4, 8, "step 6: learning has stalled")]
    page = build_report(run).read_text()
    assert "Learning stalled at steps 4–8" in page and "step 6: learning has stalled" in page
    assert "Shaded: steps where learning stalled" in page
    assert (run / "report" / "reward.png").is_file() and (run / "report" / "optimizer.png").is_file()
    assert build_report(run, x="time").is_file()  # the span on a time axis too


def test_the_status_of_a_run_stopped_on_a_stall():
    m = Metrics([{"step": s, "reward": 0.1} for s in (1, 2, 3)])
    kind, text = run_status(m, {"steps": 3, "stopped_by": "stall", "stall_checkpoint": "out/checkpoints/checkpoint-1"},
                            {"run": {"max_steps": 10}})
    assert kind == "stopped" and text == ("Stopped at step 3 of 10: learning stalled (run.stop_on_stall=true); the "
                                          "last checkpoint from before the stall is out/checkpoints/checkpoint-1.")


def test_one_model_path_keeps_the_run_folder_in_its_header(tmp_path):
    model = tmp_path / "outputs" / "smollm2-addition" / "final"
    (label,) = column_labels([str(model)])
    assert label == "…/smollm2-addition/final"
    assert column_labels(["outputs/run/final"]) == ["outputs/run/final"]  # short and relative: as given
