"""Evaluation during training (eval.*): schedule, records in metrics.jsonl, summary, agreement with a direct
evaluate() call on the same model, validation."""

import dataclasses
import json
import re

import pytest
from run_helpers import cli, write_run

from slimgrpo.config import ConfigError, from_dict, load_config, merge_overrides, validate_config
from slimgrpo.evaluate.during import eval_summary
from slimgrpo.output.metrics import describe_eval

EVAL_PROMPTS = [{"prompt": f"Name {w} words.", "answer": "x"} for w in ("two", "three", "four", "five", "six")]


def _records(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def _setup(tmp_path, tiny_model_dir, **eval_cfg):
    (tmp_path / "heldout.jsonl").parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in EVAL_PROMPTS))
    return write_run(tmp_path, tiny_model_dir, run={"max_steps": 5, "batch_size": 8, "output_dir": str(tmp_path / "run"),
                                                    "seed": 5, "num_threads": 1},
                     eval={"data": "heldout.jsonl", "num_samples": 3, "threshold": 0.1, **eval_cfg})


def test_eval_before_every_n_steps_and_at_the_end(tmp_path, tiny_model_dir):
    cfg_path = _setup(tmp_path, tiny_model_dir, steps=2)
    proc = cli("train", str(cfg_path))
    assert proc.returncode == 0, proc.stderr
    records = _records(tmp_path / "run")
    evals = {r["step"]: r for r in records if "eval/accuracy_greedy" in r}
    assert sorted(evals) == [0, 2, 4, 5]  # before, every 2 steps, after the last (5)
    assert set(evals[0]) == {"step", "eval/accuracy_greedy", "eval/accuracy_sampled", "eval/pass@3",
                             "eval/mean_reward", "eval/rewards/vowels", "eval/rewards/length", "time/eval_s"}
    for r in evals.values():
        assert 0 <= r["eval/accuracy_sampled"] <= r["eval/pass@3"] <= 1
        assert 0 <= r["eval/accuracy_greedy"] <= 1
    assert "reward" in evals[2] and "reward" not in evals[0]  # merged into the step's record
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_before/accuracy_greedy"] == evals[0]["eval/accuracy_greedy"]
    assert summary["eval_after/accuracy_sampled"] == evals[5]["eval/accuracy_sampled"]
    assert summary["eval_after/step"] == 5
    # the terminal tells the story: banner, eval before, end summary with next steps
    out = proc.stdout
    assert "parameters" in out and "trainable of" in out and "5 held-out prompts x 3 samples" in out
    assert "eval before training: greedy" in out
    line = out.split("step 2:")[1].splitlines()[0]  # the step line shows what the evaluation cost
    assert re.search(r"\| eval greedy .*  \(\d+\.\d s\)$", line), line
    assert evals[2]["time/eval_s"] > 0
    assert "done: 5 steps in" in out and f"slimgrpo report {tmp_path / 'run'}" in out
    assert f"{tmp_path / 'run' / 'final'}" in out
    assert "Warning" not in proc.stdout + proc.stderr  # third-party warnings are silenced


def test_step_zero_eval_matches_a_direct_evaluate_call(tmp_path, tiny_model_dir):
    from slimgrpo.data import load_prompt_dataset
    from slimgrpo.evaluate import EvalSettings, evaluate
    from slimgrpo.train.trainer import Trainer

    cfg = load_config(str(_setup(tmp_path, tiny_model_dir, steps=0)), ["run.max_steps=1", "log.progress=false"])
    trainer = Trainer(cfg)
    got = trainer.evaluator.run()
    ds = load_prompt_dataset(str(tmp_path / "heldout.jsonl"), trainer.policy.tokenizer, cfg.data)
    greedy = evaluate(trainer.policy.model, trainer.policy.tokenizer, ds, trainer.reward_runner,
                      EvalSettings(dataclasses.replace(trainer.sampling, temperature=0.0), num_samples=1,
                                   seed=cfg.run.seed, success_threshold=0.1))
    sampled = evaluate(trainer.policy.model, trainer.policy.tokenizer, ds, trainer.reward_runner,
                       EvalSettings(trainer.sampling, num_samples=3, ks=(3,), seed=cfg.run.seed, success_threshold=0.1,
                                    prompts_per_batch=trainer.evaluator.prompts_per_batch))
    assert got["eval/accuracy_greedy"] == pytest.approx(greedy.accuracy)
    assert got["eval/accuracy_sampled"] == pytest.approx(sampled.accuracy)
    assert got["eval/pass@3"] == pytest.approx(sampled.pass_at[3])
    assert got["eval/mean_reward"] == pytest.approx(sampled.mean_reward)


def test_eval_summary_and_describe():
    history = [{"step": 0, "eval/accuracy_greedy": 0.25, "eval/accuracy_sampled": 0.125},
               {"step": 1, "reward": 0.5},
               {"step": 2, "reward": 0.7, "eval/accuracy_greedy": 0.5, "eval/accuracy_sampled": 0.375,
                "eval/pass@4": 0.75}]
    s = eval_summary(history)
    assert s["eval_before/accuracy_greedy"] == 0.25 and s["eval_after/accuracy_greedy"] == 0.5
    assert s["eval_after/step"] == 2 and "eval_before/pass@4" not in s
    assert describe_eval(history[2]) == "greedy 50.0%  sampled 37.5%  pass@4 75.0%"
    assert eval_summary([{"step": 1, "reward": 0.1}]) == {}
    assert "eval_skipped_at_step" not in eval_summary(history, final_step=2)


def test_a_run_stopped_early_reports_its_skipped_eval_never_before_as_after():
    """Stopped at step 1 by a signal, eval.steps=0: the only eval is the one before training."""
    history = [{"step": 0, "eval/accuracy_greedy": 0.25, "eval/accuracy_sampled": 0.125}, {"step": 1, "reward": 0.5}]
    s = eval_summary(history, final_step=1)
    assert s["eval_before/accuracy_greedy"] == 0.25 and "eval_after/accuracy_greedy" not in s
    assert s["eval_skipped_at_step"] == 1


@pytest.mark.parametrize("override, message", [("eval.steps=-1", "eval.steps"), ("eval.num_samples=0", "eval.num_samples"),
                                                ("eval.max_prompts=0", "eval.max_prompts"),
                                                ("eval.temperature=-0.5", "eval.temperature")])
def test_eval_config_is_validated(override, message):
    cfg = from_dict(merge_overrides({"model": {"path": "m"}, "data": {"path": "d.jsonl"},
                                     "rewards": {"functions": ["length"]}}, [override]))
    with pytest.raises(ConfigError, match=message):
        validate_config(cfg)


def test_missing_eval_file_is_a_clear_error(tmp_path, tiny_model_dir):
    cfg_path = _setup(tmp_path, tiny_model_dir)
    proc = cli("train", str(cfg_path), "eval.data=nowhere.jsonl")
    assert proc.returncode == 2 and "nowhere.jsonl" in proc.stderr
