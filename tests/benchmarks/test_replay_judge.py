"""benchmarks/learning/replay_judge.py: the step another judge keeps, replayed on a campaign's recorded evaluations; a
score reused only where that step's model was scored; a rerun taken only when it trained the same way."""

import json
from pathlib import Path

import pytest

from benchmarks.learning import replay_judge

BASE = {"sampled_accuracy": 0.1, "greedy_accuracy": 0.3}


def _eval(s, g):
    return {"sampled_accuracy": s, "greedy_accuracy": g}


def _campaign(root: Path, runs: dict, rewards=(0.1, 0.2, 0.3, 0.4)) -> Path:
    """One task, 4 steps, evaluations at 0, 2 and 4: runs = {key: (greedy values, mean rewards, run fields)}."""
    entry = {"settings": {"steps": 4, "keep_best": True}, "base": BASE}
    for key, (greedy, reward, fields) in runs.items():
        folder = root / "t" / key
        folder.mkdir(parents=True)
        lines = []
        for step in range(5):
            r = {"step": step}
            if step:
                r.update(reward=rewards[step - 1], loss=0.0)
            if step % 2 == 0:
                r.update({"eval/accuracy_greedy": greedy[step // 2], "eval/mean_reward": reward[step // 2],
                          "eval/accuracy_sampled": 0.0})
            lines.append(json.dumps(r))
        (folder / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        entry[key] = {"wall_s": 1.0, "peak_rss_mib": 1.0, "collapsed": False, **fields}
    (root / "results.json").write_text(json.dumps({"t": entry}))
    return root


def test_replayed_step_follows_the_judge():
    records = [{"step": 0, "eval/m": 0.5}, {"step": 1}, {"step": 2, "eval/m": 0.7}, {"step": 4, "eval/m": 0.6}]
    assert replay_judge.replayed_step(records, "eval/m") == (2, 0.7)


def test_scores_are_reused_only_for_scored_models(tmp_path):
    camp = _campaign(tmp_path / "old", {
        # greedy kept step 0; the reward keeps step 4, the last: its last/ model was scored
        "slimgrpo-s0": ([0.5, 0.4, 0.4], [0.1, 0.2, 0.3],
                        {"eval": _eval(0.1, 0.3), "eval_last": _eval(0.4, 0.5), "final_step": 0}),
        # the reward keeps step 2, neither final/ (4) nor last/: not scored
        "slimgrpo-s1": ([0.1, 0.2, 0.3], [0.1, 0.5, 0.3], {"eval": _eval(0.2, 0.4), "final_step": 4}),
    })
    results, notes = replay_judge.replay(camp, "eval/mean_reward", [])
    kept = results["t"]["slimgrpo-s0"]
    assert kept["eval"] == _eval(0.4, 0.5) and kept["final_step"] == 4 and kept["best_value"] == 0.3
    assert "slimgrpo-s1" not in results["t"]
    assert any("s1: eval/mean_reward keeps step 2, whose model was not scored" in n for n in notes)


def test_a_rerun_is_taken_when_it_trained_the_same_way_and_refused_otherwise(tmp_path):
    runs = {"slimgrpo-s1": ([0.1, 0.2, 0.3], [0.1, 0.5, 0.3], {"eval": _eval(0.2, 0.4), "final_step": 4})}
    camp = _campaign(tmp_path / "old", runs)
    same = _campaign(tmp_path / "same", {"slimgrpo-s1": ([0.1, 0.2, 0.3], [0.1, 0.5, 0.3],
                                                         {"eval": _eval(0.3, 0.4), "final_step": 2})})
    results, notes = replay_judge.replay(camp, "eval/mean_reward", [same])
    assert results["t"]["slimgrpo-s1"]["eval"] == _eval(0.3, 0.4)
    assert results["t"]["slimgrpo-s1"]["eval_last"] == _eval(0.2, 0.4)  # the recorded run's last step, same model
    other = _campaign(tmp_path / "other", {"slimgrpo-s1": ([0.1, 0.2, 0.3], [0.1, 0.5, 0.3],
                                                          {"eval": _eval(0.3, 0.4), "final_step": 2})},
                      rewards=(0.1, 0.2, 0.35, 0.4))
    with pytest.raises(SystemExit, match="trained differently"):
        replay_judge.replay(camp, "eval/mean_reward", [other])
