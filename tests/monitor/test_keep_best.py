"""run.keep_best (TRL's load_best_model_at_end): the best judgement's checkpoint survives the rotation, final/
is its model and last/ the last step's, summary / terminal name the step and value, a killed run resumes with
its best-so-far, a damaged best checkpoint leaves the last model with a warning, and bad input is refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from run_helpers import write_run
from safetensors.torch import load_file

from slimgrpo.config import ConfigError, load_config
from slimgrpo.checkpoint import format as ckpt
from slimgrpo.monitor.best import BestSettings, BestTracker
from slimgrpo.train.trainer import Trainer

HELDOUT = [{"prompt": f"Name {w} words.", "answer": "x"} for w in ("two", "three", "four", "five")]


def _config(tmp_path, tiny_model_dir, overrides=(), **run):
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HELDOUT))
    path = write_run(tmp_path, tiny_model_dir,
                     run={"max_steps": 6, "batch_size": 8, "output_dir": str(tmp_path / "run"), "seed": 5,
                          "num_threads": 1, "keep_best": True, "save_total_limit": 1, **run},
                     eval={"data": "heldout.jsonl", "steps": 1, "num_samples": 2, "threshold": 0.1},
                     log={"progress": False, "log_completions_steps": 0})
    return load_config(str(path), list(overrides))


def _scripted(trainer: Trainer, values: dict[int, float]):
    """Replace the held-out evaluation by a script: ``values[step]`` is eval/accuracy_greedy after that step
    (0: before training). The run around it is real: steps, checkpoints, rotation, resume, final/."""
    def run():
        step = trainer.step_idx
        return {"eval/accuracy_greedy": values[step], "eval/accuracy_sampled": values[step] / 2}
    trainer.evaluator.run = run


def _train(cfg, values, callbacks=()):
    trainer = Trainer(cfg, callbacks=list(callbacks))
    _scripted(trainer, values)
    return trainer, trainer.train()


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    shared = set(a) & set(b)
    return bool(shared) and all(torch.equal(a[k], b[k]) for k in shared)


def _steps(run: Path) -> list[int]:
    return [ckpt.checkpoint_step(p) for p in ckpt.list_complete(ckpt.checkpoint_dir(run))]


def test_final_is_the_best_and_its_checkpoint_survives_rotation(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, save_steps=1)  # a checkpoint every step, only 1 kept by rotation
    values = {0: 0.30, 1: 0.35, 2: 0.60, 3: 0.40, 4: 0.55, 5: 0.60, 6: 0.50}  # 5 ties 2: the earlier stays best
    trainer, summary = _train(cfg, values)
    run = tmp_path / "run"
    assert _steps(run) == [2, 6]  # the newest (save_total_limit=1) and the best, never pruned
    assert (summary["best_step"], summary["best_value"], summary["final_step"]) == (2, 0.60, 2)
    assert summary["best_metric"] == "eval/accuracy_greedy" and summary["eval_best/accuracy_greedy"] == 0.60
    final, last = _weights(run / "final"), _weights(run / "last")
    assert _same(final, _weights(run / "checkpoints" / "checkpoint-2" / "model"))
    assert _same(last, _weights(run / "checkpoints" / "checkpoint-6" / "model"))
    assert not _same(final, last)  # the weights did move between steps 2 and 6
    records = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert records[0]["best/step"] == 0 and records[2]["best/improved"] == 1 and records[5]["best/improved"] == 0
    assert records[6]["best/step"] == 2 and records[6]["best/value"] == 0.60
    assert json.loads((run / "summary.json").read_text())["final_step"] == 2


def test_a_new_best_is_saved_whatever_save_steps_says(tmp_path, tiny_model_dir):
    """save_steps=0 (only at the end): a new best still writes its checkpoint; the one before training too."""
    cfg = _config(tmp_path, tiny_model_dir, save_steps=0, max_steps=4)
    trainer, summary = _train(cfg, {0: 0.5, 1: 0.2, 2: 0.3, 3: 0.1, 4: 0.4})
    run = tmp_path / "run"
    assert summary["best_step"] == 0 and summary["final_step"] == 0  # training only made it worse
    assert _steps(run) == [0, 4]
    base = _weights(Path(cfg.model.path))
    assert _same(_weights(run / "final"), base)  # the model it started from
    assert not _same(_weights(run / "last"), base)


def test_without_keep_best_final_is_the_last_step(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, keep_best=False, max_steps=3)
    trainer, summary = _train(cfg, {0: 0.9, 1: 0.1, 2: 0.1, 3: 0.1})
    run = tmp_path / "run"
    assert "best_step" not in summary and not (run / "last").exists()
    assert _same(_weights(run / "final"), _weights(run / "checkpoints" / "checkpoint-3" / "model"))


def test_a_killed_run_resumes_with_its_best_so_far(tmp_path, tiny_model_dir):
    values = {0: 0.1, 1: 0.2, 2: 0.7, 3: 0.3, 4: 0.4, 5: 0.5, 6: 0.6}
    cfg = _config(tmp_path, tiny_model_dir, save_steps=1)
    # stopped after step 4 (the checkpoint of step 4 holds the tracker's state; the kill tests of
    # test_resume_exact.py show a killed run resumes from its newest checkpoint the same way)
    trainer, summary = _train(cfg, values, callbacks=[lambda t, step, m: step >= 4])
    assert summary["steps"] == 4 and summary["best_step"] == 2
    assert _steps(tmp_path / "run") == [2, 4]
    cfg = _config(tmp_path, tiny_model_dir, save_steps=1)
    trainer, summary = _train(cfg, values)  # run.resume=auto: from checkpoint-4
    assert trainer.watch.best.judged[0] == (0, 0.1)  # the judgements before the kill came back
    assert (summary["best_step"], summary["best_value"], summary["final_step"]) == (2, 0.7, 2)
    assert _steps(tmp_path / "run") == [2, 6]
    run = tmp_path / "run"
    assert _same(_weights(run / "final"), _weights(run / "checkpoints" / "checkpoint-2" / "model"))


def test_a_damaged_best_checkpoint_leaves_the_last_model(tmp_path, tiny_model_dir, caplog):
    cfg = _config(tmp_path, tiny_model_dir, max_steps=3)
    run = tmp_path / "run"
    damaged = run / "checkpoints" / "checkpoint-1" / "model" / "model.safetensors"

    def damage(trainer, step, metrics):
        if step == 3:
            damaged.write_bytes(damaged.read_bytes()[:100])

    with caplog.at_level(logging.WARNING, logger="slimgrpo"):
        trainer, summary = _train(cfg, {0: 0.1, 1: 0.9, 2: 0.2, 3: 0.3}, callbacks=[damage])
    assert summary["best_step"] == 1 and summary["final_step"] == 3
    assert "model/model.safetensors" in summary["best_checkpoint_problem"]
    assert "checkpoint-1" in caplog.text and "model/model.safetensors" in caplog.text
    assert _same(_weights(run / "final"), _weights(run / "checkpoints" / "checkpoint-3" / "model"))


def test_terminal_names_the_best_step(tmp_path, tiny_model_dir):
    from slimgrpo.output.console import summary_lines

    cfg = _config(tmp_path, tiny_model_dir, max_steps=3)
    summary = {"steps": 3, "best_metric": "eval/accuracy_greedy", "best_step": 1, "best_value": 0.75,
               "final_step": 1}
    (tmp_path / "run" / "final").mkdir(parents=True)
    text = "\n".join(summary_lines(summary, cfg, [], None))
    assert "the best: step 1, eval/accuracy_greedy 0.75" in text and str(tmp_path / "run" / "last") in text
    cfg.run.keep_best = False
    assert "the last step's; run.keep_best=true keeps the best one" in "\n".join(summary_lines(summary, cfg, [], None))


# ----------------------------------------------------------------------------- the tracker alone


def test_tracker_training_metric_is_judged_on_its_mean_every_save_steps():
    t = BestTracker(BestSettings("reward", every=2, max_steps=5))
    rewards = {1: 0.1, 2: 0.3, 3: 0.9, 4: 0.1, 5: 0.2}
    judged = {s: t.observe(s, {"reward": r}) for s, r in rewards.items()}
    assert [s for s, j in judged.items() if j is not None] == [2, 4, 5]  # every 2 steps and the last
    assert judged[2].value == pytest.approx(0.2) and judged[4].value == pytest.approx(0.5)
    assert (t.step, t.value) == (4, pytest.approx(0.5))


def test_tracker_follows_trl_threshold_and_direction():
    t = BestTracker(BestSettings("eval/mean_reward", greater_is_better=False, patience=2, threshold=0.1))
    seq = [(0, 1.0), (1, 0.95), (2, 0.97), (3, 0.5)]
    out = [t.observe(s, {"eval/mean_reward": v}) for s, v in seq]
    assert [j.improved for j in out] == [True, True, False, True]  # lower is better; any improvement is the best
    assert [j.wait for j in out] == [0, 1, 2, 0]  # ... but only one of more than 0.1 resets the patience
    assert [j.stop for j in out] == [False, False, True, False]
    assert t.observe(4, {"eval/mean_reward": float("nan")}).improved is False
    state = t.state_dict()
    again = BestTracker(t.settings)
    again.load_state_dict(state)
    assert (again.step, again.value, again.wait) == (3, 0.5, 1)


def test_a_saturated_metric_tie_goes_to_the_better_sampled_score_and_then_stays_first():
    """The extract recipe's seed 0 (learning suite, sixteenth session): greedy validation 100% at steps 20, 30 and
    40; TRL's first-of-equals kept step 20 (sampled 90.6%). The tie goes to the higher sampled accuracy, then the
    higher mean reward; equal on all, the first stays. Patience counts ties as no improvement (TRL's threshold)."""
    t = BestTracker(BestSettings("eval/accuracy_greedy", patience=5))
    seq = [(0, 0.344, 0.031, 0.221), (10, 0.938, 0.312, 0.6), (20, 1.0, 0.906, 1.232), (30, 1.0, 1.0, 1.345),
           (40, 1.0, 1.0, 1.363), (50, 1.0, 1.0, 1.363), (60, 1.0, None, 2.0)]
    out = [t.observe(s, {"eval/accuracy_greedy": g, "eval/accuracy_sampled": a, "eval/mean_reward": r})
           for s, g, a, r in seq]
    assert [j.improved for j in out] == [True, True, True, True, True, False, False]
    assert (t.step, t.value) == (40, 1.0)
    assert [j.wait for j in out] == [0, 0, 0, 1, 2, 3, 4]  # ties win the best, not the patience
    state = t.state_dict()
    again = BestTracker(t.settings)
    again.load_state_dict(state)  # a resumed run keeps the scores its ties are judged by
    assert again.tie == t.tie == (1.0, 1.363)
    assert not again.observe(70, {"eval/accuracy_greedy": 1.0, "eval/accuracy_sampled": 1.0,
                                  "eval/mean_reward": 1.3}).improved
    # a training metric never ties by this rule (its mean over steps), nor does a lower-is-better one win a tie
    # by its own direction: the tie scores are higher-is-better held-out scores
    r = BestTracker(BestSettings("reward", every=1, max_steps=3))
    assert [r.observe(s, {"reward": 0.5}).improved for s in (1, 2, 3)] == [True, False, False]


def test_prune_never_deletes_the_protected_steps(tmp_path):
    root = tmp_path / "checkpoints"
    for step in range(1, 8):
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / ckpt.MARKER).write_text("{}")
    ckpt._prune(root, keep=2, step=7, protect=(3, 5))
    assert sorted(int(p.name.split("-")[1]) for p in root.iterdir()) == [3, 5, 6, 7]


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("overrides, needle", [
    (["eval.data=", "run.keep_best=true"], "run.keep_best=true has no metric to judge"),
    (["run.keep_best=true", "run.best_metric=eval/accuracy"], "run.best_metric='eval/accuracy' is not a metric"),
    (["run.keep_best=true", "run.early_stopping_patience=0"], "run.early_stopping_patience must be >= 1"),
    (["run.keep_best=true", "run.early_stopping_patience=-2"], "run.early_stopping_patience must be >= 1"),
    (["run.early_stopping_patience=3"], "set run.keep_best=true too"),
    (["run.keep_best=true", "run.save_checkpoints=false"], "run.save_checkpoints=true"),
    (["run.keep_best=true", "run.best_metric=reward", "run.save_steps=0"], "set run.save_steps"),
])
def test_bad_input_is_refused_naming_the_key(tmp_path, tiny_model_dir, overrides, needle):
    (tmp_path / "heldout.jsonl").write_text(json.dumps(HELDOUT[0]) + "\n")
    path = write_run(tmp_path, tiny_model_dir, eval={"data": "heldout.jsonl", "num_samples": 2})
    with pytest.raises(ConfigError) as err:
        load_config(str(path), overrides)
    assert needle in str(err.value)
    if "not a metric" in needle or "no metric" in needle:  # the metrics available are listed
        assert "rewards/vowels/mean" in str(err.value)


def test_a_judge_without_keep_best_is_accepted_and_judges_nothing(tmp_path, tiny_model_dir):
    """A recipe names its judge; switching keep_best off on the command line (with or without evaluation and
    checkpoints) must not need the judge cleared too (TRL accepts metric_for_best_model alone)."""
    from slimgrpo.monitor.best import settings_for

    (tmp_path / "heldout.jsonl").write_text(json.dumps(HELDOUT[0]) + "\n")
    path = write_run(tmp_path, tiny_model_dir, eval={"data": "heldout.jsonl", "num_samples": 2},
                     run={"keep_best": True, "best_metric": "eval/mean_reward"})
    for overrides in (["run.keep_best=false", "run.save_checkpoints=false"], ["run.keep_best=false", "eval.data="]):
        cfg = load_config(str(path), overrides)
        assert cfg.run.best_metric == "eval/mean_reward" and settings_for(cfg) is None


def test_metric_names_that_work(tmp_path, tiny_model_dir):
    (tmp_path / "heldout.jsonl").write_text(json.dumps(HELDOUT[0]) + "\n")
    path = write_run(tmp_path, tiny_model_dir, eval={"data": "heldout.jsonl", "num_samples": 2})
    for metric in ("eval/accuracy_sampled", "eval/pass@2", "eval/rewards/vowels", "eval/mean_reward"):
        load_config(str(path), ["run.keep_best=true", f"run.best_metric={metric}"])
    load_config(str(path), ["run.keep_best=true", "run.best_metric=rewards/vowels/mean", "run.save_steps=5",
                            "eval.data="])


def test_the_demo_keeps_the_best_of_before_and_after(tmp_path):
    """`slimgrpo demo` (eval.steps=0: the evaluations before and after training) returns the better model."""
    from slimgrpo.config.best import best_metric
    from slimgrpo.commands.demo import demo_config

    for algorithm in ("grpo", "ppo"):
        cfg, _ = demo_config(str(tmp_path / "out"), [], algorithm=algorithm)
        assert cfg.run.keep_best and best_metric(cfg) == "eval/accuracy_greedy" and cfg.eval.steps == 0


def test_a_training_reward_is_judged_at_each_checkpoint_on_its_mean(tmp_path, tiny_model_dir):
    """run.best_metric=reward without eval.data: judged every save_steps steps on the mean since the last."""
    cfg = _config(tmp_path, tiny_model_dir, ["eval.data=", "run.best_metric=reward"], save_steps=2, max_steps=4)
    trainer = Trainer(cfg)
    summary = trainer.train()
    run = tmp_path / "run"
    records = [json.loads(r) for r in (run / "metrics.jsonl").read_text().splitlines()]
    means = {s: (records[s - 2]["reward"] + records[s - 1]["reward"]) / 2 for s in (2, 4)}  # records: steps 1..4
    best = max(means, key=lambda s: (means[s], -s))
    assert summary["best_metric"] == "reward" and summary["best_step"] == best
    assert summary["best_value"] == pytest.approx(means[best])
    assert [r.get("best/improved") for r in records] == [None, 1, None, int(means[4] > means[2])]
    assert best in _steps(run)


def test_a_sigkilled_run_resumes_to_the_same_best_and_final_model(tmp_path, tiny_model_dir):
    """The CLI killed by SIGKILL right after installing step 3's checkpoint, then run again: the same judgements,
    best step and final/ weights as a run never interrupted (CPU: bit for bit), the best checkpoint on disk."""
    from run_helpers import cli

    runs = {}
    for name, env in (("plain", {}), ("killed", {"SLIMGRPO_DEBUG_KILL_IN_SAVE": "rename@3"})):
        folder = tmp_path / name
        folder.mkdir()
        _config(folder, tiny_model_dir, save_steps=1, max_steps=5)
        first = cli("train", str(folder / "cfg.yaml"), env=env)
        if env:
            assert first.returncode == -9 and not (folder / "run" / "summary.json").exists()
            again = cli("train", str(folder / "cfg.yaml"))
            assert again.returncode == 0, again.stderr[-2000:]
        else:
            assert first.returncode == 0, first.stderr[-2000:]
        runs[name] = folder / "run"
    a, b = (json.loads((runs[n] / "summary.json").read_text()) for n in ("plain", "killed"))
    assert (a["best_step"], a["best_value"], a["final_step"]) == (b["best_step"], b["best_value"], b["final_step"])
    assert _same(_weights(runs["plain"] / "final"), _weights(runs["killed"] / "final"))
    assert a["best_step"] in _steps(runs["killed"]) and _steps(runs["plain"]) == _steps(runs["killed"])
