"""A run that says when it stops learning (monitor/stall.py): the detector over scripted per-step numbers (no
model), the step-1 warning for a reward without spread, checkpoint pruning that spares the last checkpoint
from before a stall, and one end-to-end run of the tiny demo model whose reward saturates."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import yaml

from slimgrpo.monitor.stall import (ENTROPY_COLLAPSE, NO_SIGNAL, StallDetector, StallLimits, StepNumbers,
                                  no_spread_warnings)

LIMITS = StallLimits(steps=4, zero_std_fraction=0.75, entropy_ratio=0.2, reward_flat=0.1, learning_rate=1e-5,
                     temperature=1.0)


def step(reward=0.4, zero_std=0.25, entropy=1.0, reward_std=0.3, fns=None, **extra):
    """One step's metrics as step_metrics writes them; ``fns``: {name: (mean, std, frac_zero_std)}."""
    m = {"reward": reward, "reward_std": reward_std, "frac_reward_zero_std": zero_std, "entropy": entropy,
         "update_skipped": 0, **extra}
    for name, (mean, std, z) in (fns or {"acc": (reward, reward_std, zero_std)}).items():
        m.update({f"rewards/{name}/mean": mean, f"rewards/{name}/std": std, f"rewards/{name}/frac_zero_std": z})
    return m


def run(history, limits=LIMITS):
    detector = StallDetector(limits)
    verdicts = [detector.observe(i, metrics) for i, metrics in enumerate(history, start=1)]
    return detector, verdicts


def test_a_learning_run_never_stalls():
    history = [step(reward=0.1 + 0.02 * i, zero_std=0.5 if i % 3 else 0.75, entropy=1.0 - 0.02 * i) for i in range(40)]
    detector, verdicts = run(history)
    assert detector.stalls == [] and all(not v.fields for v in verdicts)


def test_a_saturated_reward_is_reported_once_with_its_start_the_numbers_and_the_cause():
    rising = [step(reward=r, zero_std=0.25, fns={"acc": (r, 0.4, 0.25)}) for r in (0.2, 0.4, 0.6)]
    solved = [step(reward=1.0, zero_std=1.0, reward_std=0.0, entropy=0.6, fns={"acc": (1.0, 0.0, 1.0)})] * 8
    detector, verdicts = run(rising + solved)
    detected = [i + 1 for i, v in enumerate(verdicts) if v.detected]
    assert detected == [7]  # steps 4..7 without signal: said once, at step 7
    (stall,) = detector.stalls
    assert (stall.kind, stall.start_step, stall.detected_step, stall.end_step) == (NO_SIGNAL, 4, 7, 11)
    text = stall.message
    assert text.startswith("step 7: learning has stalled since step 4: for 4 steps, 100% of the groups")
    assert "frac_reward_zero_std >= 0.75" in text and "mean reward 1" in text
    assert "reward acc saturated at 1, its best so far" in text
    v7 = verdicts[6].fields
    assert v7["stall/detected"] == 1 and v7["stall/kind"] == NO_SIGNAL and v7["stall/start_step"] == 4
    assert v7["stall/reason"] == text
    # every later step of the stretch carries its start (the record of the stretch), nothing is said again
    assert [v.fields.get("stall/start_step") for v in verdicts[7:]] == [4, 4, 4, 4]
    assert [v.fields.get("stall/steps") for v in verdicts[6:]] == [4, 5, 6, 7, 8]
    assert all("stall/detected" not in v.fields for v in verdicts[7:])


def test_the_stretch_ends_when_signal_returns_and_a_new_one_is_reported_again():
    dead, alive = step(reward=0.0, zero_std=1.0, fns={"acc": (0.0, 0.0, 1.0)}), step(reward=0.3)
    detector, verdicts = run([alive] * 2 + [dead] * 5 + [alive] * 2 + [dead] * 4)
    assert [(s.start_step, s.end_step) for s in detector.stalls] == [(3, 7), (10, 13)]
    assert not verdicts[7].fields  # step 8 is healthy: no stall/* fields
    assert "stuck at 0, its lowest so far" in detector.stalls[0].message


def test_entropy_collapse_with_a_flat_reward_names_the_learning_rate():
    start = [step(reward=0.3, entropy=1.0, zero_std=0.25)] * 3
    collapsed = [step(reward=0.5, entropy=0.1, zero_std=0.5)] * 5  # still some spread in half the groups
    detector, verdicts = run(start + collapsed)
    (stall,) = detector.stalls
    assert (stall.kind, stall.detected_step, stall.start_step) == (ENTROPY_COLLAPSE, 7, 4)
    assert "token entropy 0.1 (10% of its start, 1)" in stall.message
    assert "learning rate too high (optim.learning_rate=1e-05) or a sampling temperature too low" in stall.message


def test_low_temperature_is_named_first():
    limits = StallLimits(steps=3, learning_rate=1e-5, temperature=0.3)
    detector, _ = run([step(entropy=1.0)] * 3 + [step(entropy=0.05, zero_std=0.5)] * 3, limits)
    assert "a sampling temperature too low (rollout.temperature=0.3) or a learning rate" in detector.stalls[0].message


def test_low_entropy_while_the_reward_still_climbs_is_not_a_stall():
    history = [step(reward=0.3, entropy=1.0)] * 3 + [step(reward=0.3 + 0.1 * i, entropy=0.1, zero_std=0.5)
                                                     for i in range(8)]
    assert run(history)[0].stalls == []


def test_a_skipped_step_leaves_the_streak_alone_and_zero_steps_turns_it_off():
    dead = step(reward=0.0, zero_std=1.0)
    skipped = {"update_skipped": 1, "reward": None}
    detector, _ = run([dead, dead, skipped, dead, dead])
    assert [s.start_step for s in detector.stalls] == [1]
    assert run([dead] * 20, StallLimits(steps=0))[0].stalls == []


def test_the_checkpoint_before_a_candidate_stretch_is_protected():
    dead, alive = step(reward=0.0, zero_std=1.0), step(reward=0.3)
    detector, _ = run([alive] * 5)
    assert detector.protected_step() is None
    detector.observe(6, dead)
    detector.observe(7, dead)
    assert detector.protected_step() == 5  # the state before step 6, the stretch's first step
    detector.observe(8, alive)
    assert detector.protected_step() is None


def test_replay_after_resume_restores_the_stretch_silently():
    dead = step(reward=0.0, zero_std=1.0)
    history = [{"step": i, **m} for i, m in enumerate([step()] + [dead] * 5, start=1)]
    detector = StallDetector(LIMITS)
    detector.replay(history)
    assert detector.active is not None and detector.active.start_step == 2
    verdict = detector.observe(7, dead)
    assert verdict.detected is None and verdict.fields["stall/start_step"] == 2  # not said twice


# ----------------------------------------------------------------------------- bad input: no spread at step 1


def test_a_single_constant_reward_is_named_at_step_1():
    n = StepNumbers.from_metrics(1, step(reward=1.0, zero_std=1.0, reward_std=0.0, fns={"always_one": (1.0, 0.0, 1.0)}))
    (warning,) = no_spread_warnings(n)
    assert warning.startswith("reward always_one: no spread: GRPO cannot learn from it. At step 1 every completion "
                              "scored 1, so every advantage is 0 and the update has no reward signal")


def test_a_constant_format_reward_beside_a_varying_accuracy_says_which_one_drives_the_update():
    n = StepNumbers.from_metrics(1, step(fns={"format": (1.0, 0.0, 1.0), "accuracy": (0.3, 0.4, 0.25)}))
    (warning,) = no_spread_warnings(n)
    assert warning.startswith("reward format: no spread: GRPO cannot learn from it.")
    assert "so only accuracy drives the update" in warning and "always satisfied" in warning


def test_alike_within_groups_but_not_across_them_still_counts_and_spread_in_one_group_does_not():
    alike = StepNumbers.from_metrics(1, step(fns={"acc": (0.5, 0.5, 1.0)}))
    assert "the completions of each group scored alike (mean 0.5)" in no_spread_warnings(alike)[0]
    assert no_spread_warnings(StepNumbers.from_metrics(1, step(fns={"acc": (0.5, 0.5, 0.9)}))) == []


# ----------------------------------------------------------------------------- pruning spares the protected one


def test_pruning_spares_the_protected_checkpoint(tmp_path):
    from slimgrpo.checkpoint import format as ckpt

    root = tmp_path / "checkpoints"
    for s in range(1, 6):
        (root / f"checkpoint-{s}").mkdir(parents=True)
        (root / f"checkpoint-{s}" / ckpt.MARKER).write_text(json.dumps({"step": s, "files": {}}))
    ckpt._prune(root, keep=2, step=5, protect=2)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-2", "checkpoint-4", "checkpoint-5"]
    ckpt._prune(root, keep=2, step=5)
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-4", "checkpoint-5"]


# ----------------------------------------------------------------------------- end to end on the demo model

SATURATING = '''
_calls = {"n": 0}


def saturating(prompts, completions, **kwargs):
    """Varies for the first two steps, then every completion scores 1.0 (the reward saturated)."""
    _calls["n"] += 1
    if _calls["n"] > 2:
        return [1.0] * len(completions)
    return [sum(map(ord, c)) % 7 / 6 for c in completions]


def always_one(prompts, completions, **kwargs):
    return [1.0] * len(completions)
'''


def write_run(tmp_path, rewards, **run) -> str:
    from slimgrpo.demo import MODEL_DIR, TRAIN_FILE

    (tmp_path / "sat_rewards.py").write_text(SATURATING)
    cfg = {
        "model": {"path": str(MODEL_DIR), "dtype": "float32"},
        "data": {"path": str(TRAIN_FILE), "max_prompt_length": 16},
        "rollout": {"num_generations": 4, "max_completion_length": 6},
        "rewards": {"functions": rewards},
        "loss": {"beta": 0.0},
        "run": {"max_steps": 10, "batch_size": 16, "save_steps": 1, "save_total_limit": 1, "device": "cpu",
                "output_dir": str(tmp_path / "run"), "seed": 3, "num_threads": 1, "stall_steps": 3, **run},
        "log": {"progress": False, "log_completions_steps": 0},
    }
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def train(*argv) -> int:
    from slimgrpo.commands.cli import main

    threads = torch.get_num_threads()
    try:
        return main(["train", *argv])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("stop", [True, False])
def test_a_saturating_reward_is_seen_on_the_terminal_in_metrics_and_stops_with_exit_5(tmp_path, capsys, caplog,
                                                                                      stop):
    caplog.set_level(logging.WARNING, logger="slimgrpo")
    rc = train(write_run(tmp_path, ["sat_rewards.py:saturating"], stop_on_stall=stop))
    out = capsys.readouterr().out
    run_dir = tmp_path / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # steps 1-2 vary; from step 3 every completion scores 1.0: steps 3, 4, 5 carry no signal -> said at step 5
    notices = [r.message for r in caplog.records if "learning has stalled" in r.message]
    assert len(notices) == 1, notices
    assert notices[0].startswith("step 5: learning has stalled since step 3: for 3 steps, 100% of the groups")
    assert "reward saturating saturated at 1, its best so far" in notices[0]
    detected = [r for r in records if r.get("stall/detected")]
    assert [r["step"] for r in detected] == [5] and detected[0]["stall/start_step"] == 3
    assert detected[0]["stall/kind"] == "no_signal" and detected[0]["frac_reward_zero_std"] == 1.0
    summary = json.loads((run_dir / "summary.json").read_text())
    checkpoints = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    if stop:
        assert rc == 5 and [r["step"] for r in records] == [1, 2, 3, 4, 5]
        assert "Stopping here (run.stop_on_stall=true, exit code 5)" in notices[0]
        # save_total_limit=1, yet checkpoint-2 (the state before step 3, the stretch's first step) is kept
        assert checkpoints == ["checkpoint-2", "checkpoint-5"]
        assert f"The last checkpoint from before the stall is {run_dir / 'checkpoints' / 'checkpoint-2'}" in notices[0]
        assert summary["stopped_by"] == "stall" and summary["stall_checkpoint"].endswith("checkpoint-2")
        assert not (run_dir / "final").exists()
        assert "stopped at step 5 of 10 in " in out and ": learning stalled (run.stop_on_stall=true, exit code 5)" in out
        assert "checkpoint  " + str(run_dir / "checkpoints" / "checkpoint-2") in out
        # the same command again resumes from checkpoint-5 and trains on: the stretch was reported already
        caplog.clear()
        assert train(write_run(tmp_path, ["sat_rewards.py:saturating"], stop_on_stall=True)) == 0
        assert not [r for r in caplog.records if "learning has stalled" in r.message]
        assert (run_dir / "final").is_dir()
        assert json.loads((run_dir / "summary.json").read_text())["stalls"][0]["end_step"] == 10
    else:
        assert rc == 0 and len(records) == 10 and (run_dir / "final").is_dir()
        assert "Training goes on (run.stop_on_stall=true would stop here" in notices[0]
        assert [r.get("stall/start_step") for r in records] == [None] * 4 + [3] * 6  # the record of the stretch
        assert checkpoints == ["checkpoint-10", "checkpoint-2"]  # the stretch lasts to the end: still kept
        assert summary["stalls"] == [{"kind": "no_signal", "start_step": 3, "detected_step": 5, "end_step": 10,
                                      "message": notices[0].split(" Training goes on")[0]}]
        assert "stalled     steps 3-10: most groups had rewards all equal" in out


def test_a_stall_stop_with_keep_best_returns_the_best_model_in_final(tmp_path, caplog):
    """run.keep_best judged on the training reward: the stall stop (exit 5) still writes final/ from the best
    checkpoint, and the stop step's model to last/ (without keep_best: no final/, the test above)."""
    caplog.set_level(logging.WARNING, logger="slimgrpo")
    rc = train(write_run(tmp_path, ["sat_rewards.py:saturating"], stop_on_stall=True, keep_best=True,
                         best_metric="reward"))
    (notice,) = [r.message for r in caplog.records if "learning has stalled" in r.message]
    assert "exit code 5), final/ gets the best model judged so far (run.keep_best)." in notice
    run_dir = tmp_path / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert rc == 5 and summary["stopped_by"] == "stall" and summary["steps"] == 5
    best = summary["final_step"]  # the first step whose reward reached 1.0 (steps 1-2 vary, then 1.0)
    assert best == summary["best_step"] and 1 <= best < 5
    assert (run_dir / "final").is_dir() and (run_dir / "last").is_dir()
    from safetensors.torch import load_file

    final = load_file(run_dir / "final" / "model.safetensors")
    kept = load_file(run_dir / "checkpoints" / f"checkpoint-{best}" / "model" / "model.safetensors")
    last = load_file(run_dir / "last" / "model.safetensors")
    assert all(torch.equal(final[k], kept[k]) for k in final)
    assert any(not torch.equal(final[k], last[k]) for k in final)


def test_a_reward_without_spread_from_step_1_is_named_at_step_1(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="slimgrpo")
    rc = train(write_run(tmp_path, ["sat_rewards.py:always_one"], max_steps=1, save_steps=0))
    assert rc == 0
    (warning,) = [r.message for r in caplog.records if "no spread" in r.message]
    assert warning.startswith("reward always_one: no spread: GRPO cannot learn from it. At step 1 every completion "
                              "scored 1")


def test_ppo_has_no_no_signal_sign_and_warns_only_for_a_reward_constant_over_the_whole_batch():
    ppo = StallLimits(steps=3, grouped=False)
    detector, _ = run([step(reward=0.0, zero_std=1.0, fns={"acc": (0.5, 0.5, 1.0)})] * 6, ppo)
    assert detector.stalls == []  # the critic still separates groups
    alike = StepNumbers.from_metrics(1, step(fns={"acc": (0.5, 0.5, 1.0)}))
    assert no_spread_warnings(alike, grouped=False) == []
    const = StepNumbers.from_metrics(1, step(fns={"acc": (1.0, 0.0, 1.0)}))
    assert no_spread_warnings(const, grouped=False)[0].startswith("reward acc: no spread: PPO cannot learn from it.")


def test_the_collapse_of_issue_30_names_every_cause():
    """Accuracy fell to 0, the format reward stays at 1, entropy fell to 0.1: most groups without spread."""
    start = [step(reward=1.3, entropy=1.0, zero_std=0.25, fns={"accuracy": (0.3, 0.45, 0.5), "format": (1.0, 0.0, 1.0)})]
    collapsed = [step(reward=1.0, entropy=0.1, zero_std=1.0, reward_std=0.0,
                      fns={"accuracy": (0.0, 0.0, 1.0), "format": (1.0, 0.0, 1.0)})]
    detector, _ = run(start * 3 + collapsed * 4)
    text = detector.stalls[0].message
    assert detector.stalls[0].kind == NO_SIGNAL and "token entropy 0.1 (10% of its start, 1)" in text
    assert "the policy turned near-deterministic" in text and "optim.learning_rate=1e-05" in text
    assert "reward accuracy is stuck at 0, its lowest so far" in text
    assert "reward format has scored 1 on every step since the start" in text
