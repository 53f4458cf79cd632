"""benchmarks/learning/learn_suite.py end to end on the bundled tiny demo model (1 task, 1 seed, 2 steps, slimgrpo
only): the table comes out and a second call skips the finished parts; TRL's settings for a recipe are its keys
under GRPOConfig names and GRPOConfig's defaults for the rest (built here; run through its child in a slow test)."""

import json
from pathlib import Path

import pytest

from benchmarks.learning import learn_suite, runs
from slimgrpo.demo import MODEL_DIR

TASK_CODE = '''
import json
import sys
from pathlib import Path

from slimgrpo.demo.task import demo_accuracy as accuracy, demo_well_formed as well_formed, make_splits


def main(argv):
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    train, heldout = make_splits(64, 8)
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        if not (out / name).exists():
            (out / name).write_text("".join(json.dumps(r) + "\\n" for r in rows))
'''

RECIPE = f'''
model: {{path: {MODEL_DIR}, dtype: float32}}
data: {{path: data/not-made-yet.jsonl, prompt_column: prompt, shuffle: true, max_prompt_length: 16}}
rollout: {{num_generations: 4, max_completion_length: 8, temperature: 1.0}}
rewards: {{functions: [tiny_add.py:accuracy, tiny_add.py:well_formed], reward_weights: [1.0, 0.5]}}
loss: {{loss_type: dapo, beta: 0.0}}
optim: {{learning_rate: 3.0e-4}}
run: {{output_dir: out, max_steps: 40, batch_size: 8, save_steps: 0}}
'''


@pytest.mark.slow  # a whole campaign in small (50 s on 2 cores)
def test_suite_end_to_end_and_resume(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny_add.py").write_text(TASK_CODE)
    (tmp_path / "tiny_add.yaml").write_text(RECIPE)
    out = tmp_path / "campaign"
    argv = ["--tasks", str(tmp_path / "tiny_add.yaml"), "--seeds", "0", "--steps", "2", "--trainers", "slimgrpo",
            "--num-threads", "1", "--eval-samples", "2", "--eval-limit", "8", "--out", str(out),
            "--png", str(tmp_path / "suite.png")]
    assert learn_suite.main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    entry = results["tiny_add"]
    assert entry["settings"]["steps"] == 2 and set(entry) == {"settings", "base", "slimgrpo-s0"}
    run = entry["slimgrpo-s0"]
    assert [c["step"] for c in run["curve"]] == [1, 2] and run["wall_s"] > 0 and run["peak_rss_mib"] > 0
    assert 0.0 <= run["eval"]["sampled_accuracy"] <= 1.0 and isinstance(run["collapsed"], bool)
    table = (out / "summary.md").read_text()
    assert "| tiny_add |" in table and "| tiny_add | slimgrpo | 0 |" in table
    assert (tmp_path / "suite.png").stat().st_size > 0
    printed = capsys.readouterr().out
    assert "| task | base sampled / greedy |" in printed

    def refuse(*args, **kwargs):
        raise AssertionError("a finished part ran again")

    monkeypatch.setattr(runs, "train_slimgrpo", refuse)
    monkeypatch.setattr(runs, "evaluate", refuse)
    assert learn_suite.main(argv[:-2]) == 0  # resumed: base and slimgrpo-s0 are in results.json
    assert json.loads((out / "results.json").read_text()) == results
    with pytest.raises(SystemExit, match="holds runs with"):  # other settings must not mix into one campaign
        learn_suite.main([*argv[:-2], "--steps", "3"])


@pytest.mark.slow
def test_suite_runs_trl_through_its_child(tmp_path):
    """The TRL side end to end (its child takes ~6 s here; with its two evals the test is ~20 s, so slow)."""
    pytest.importorskip("trl")
    (tmp_path / "tiny_add.py").write_text(TASK_CODE)
    (tmp_path / "tiny_add.yaml").write_text(RECIPE)
    out = tmp_path / "campaign"
    assert learn_suite.main(["--tasks", str(tmp_path / "tiny_add.yaml"), "--seeds", "0", "--steps", "2", "--trainers",
                             "trl", "--num-threads", "1", "--eval-samples", "2", "--eval-limit", "8",
                             "--out", str(out)]) == 0
    run = json.loads((out / "results.json").read_text())["tiny_add"]["trl-s0"]
    assert [c["step"] for c in run["curve"]] == [1, 2] and (Path(run["model"]) / "model.safetensors").is_file()
    assert run["trl_config"]["learning_rate"] == 3e-4 and "adam_beta2" not in run["trl_config"]
    assert "| tiny_add | TRL 1.16 | 0 |" in (out / "summary.md").read_text()


def test_collapse_flag():
    base = {"sampled_accuracy": 0.36, "greedy_accuracy": 0.40}
    assert learn_suite.collapsed({"sampled_accuracy": 0.0, "greedy_accuracy": 0.5}, base)
    assert learn_suite.collapsed({"sampled_accuracy": 0.5, "greedy_accuracy": 0.29}, base)
    assert not learn_suite.collapsed({"sampled_accuracy": 0.27, "greedy_accuracy": 0.31}, base)


def test_summary_means_and_ratio():
    def run(acc, wall, fell=False):
        return {"eval": {"sampled_accuracy": acc, "greedy_accuracy": acc}, "wall_s": wall, "peak_rss_mib": 1000.0,
                "collapsed": fell}

    results = {"sort": {"base": {"sampled_accuracy": 0.2, "greedy_accuracy": 0.2},
                        "trl-s0": run(0.5, 400), "trl-s1": run(0.7, 420), "slimgrpo-s0": run(0.6, 200),
                        "slimgrpo-s1": run(0.0, 210, True)}}
    table = learn_suite.summary(results)
    assert "| sort | 20.0% / 20.0% | +40.0 ± 14.1 (2) | +10.0 ± 42.4 (2) | 0 / 1 | 410 / 205 | 0.50x |" in table
    assert "| sort | slimgrpo | 1 | 210 | 1,000 | 0.0% | -20.0 | 0.0% | -20.0 | yes | - | - |" in table
    kept = {**run(0.6, 200), "final_step": 20, "best_value": 0.59375, "best_metric": "eval/accuracy_greedy"}
    row = "| sort | slimgrpo | 0 | 200 | 1,000 | 60.0% | +40.0 | 60.0% | +40.0 |  | 20 (59.4%) | - |"  # keep_best's step
    assert row in learn_suite.summary({"sort": {**results["sort"], "slimgrpo-s0": kept}})
    by_reward = {**kept, "best_value": 0.8625, "best_metric": "eval/mean_reward"}  # a reward reads as a number
    assert "| 20 (0.863) | - |" in "\n".join(learn_suite.summary({"sort": {**results["sort"], "slimgrpo-s0": by_reward}}))
    assert "kept step 20 (eval/mean_reward 0.863 on" in learn_suite.best_text(by_reward)
    one_seed = {"sort": {k: v for k, v in results["sort"].items() if not k.endswith("s1")}}
    assert "| sort | 20.0% / 20.0% | +30.0 (1) | +40.0 (1) | 0 / 0 | 400 / 200 | 0.50x |" in learn_suite.summary(one_seed)


def test_score_last_scores_last_only_where_the_best_was_earlier(tmp_path):
    """--score-last: a keep_best run whose best came before its last step gets its last/ model scored; one whose
    best was the last step reuses that score; the table shows the last step's gains beside the kept model's."""
    def run(acc, final_step):
        return {"eval": {"sampled_accuracy": acc, "greedy_accuracy": acc}, "wall_s": 1.0, "peak_rss_mib": 1.0,
                "collapsed": False, "final_step": final_step, "best_value": 0.5, "best_metric": "eval/accuracy_greedy"}

    entry = {"base": {"sampled_accuracy": 0.2, "greedy_accuracy": 0.2}, "slimgrpo-s0": run(0.6, 30),
             "slimgrpo-s1": run(0.5, 40), "slimgrpo-s2": run(0.4, 10)}
    (tmp_path / "slimgrpo-s0" / "last").mkdir(parents=True)  # s2 has no last/ left: not scored
    scored = []

    def score(model_dir, stem):
        scored.append((model_dir.relative_to(tmp_path).as_posix(), stem))
        return {"sampled_accuracy": 0.3, "greedy_accuracy": 0.1}

    learn_suite.score_last_models(entry, 40, tmp_path, score, lambda: None)
    assert scored == [("slimgrpo-s0/last", "eval-slimgrpo-s0-last")]
    assert entry["slimgrpo-s1"]["eval_last"] is entry["slimgrpo-s1"]["eval"] and "eval_last" not in entry["slimgrpo-s2"]
    table = "\n".join(learn_suite.summary({"t": entry}))
    assert "| 30 (50.0%) | +10.0 / -10.0 |" in table and "| 40 (50.0%) | +30.0 / +30.0 |" in table


def test_trl_gets_the_recipe_keys_and_its_own_defaults(tmp_path):
    recipe = learn_suite.recipe_path("addition")
    r = runs.load_recipe(recipe)
    spec = runs.trl_spec(recipe, r, Path("m"), Path("train.jsonl"), 3, 40, 2, tmp_path / "trl-s3")
    grpo = spec["grpo_config"]
    assert grpo == {"model_init_kwargs": {"dtype": "float32"}, "bf16": False, "fp16": False, "shuffle_dataset": True,
                    "num_generations": 8, "max_completion_length": 48, "temperature": 1.0, "reward_weights": [1.0, 0.5],
                    "loss_type": "dapo", "beta": 0.0, "learning_rate": 1e-5, "lr_scheduler_type": "constant",
                    "gradient_checkpointing": False, "max_steps": 40, "per_device_train_batch_size": 16,
                    "gradient_accumulation_steps": 1, "seed": 3}
    assert spec["rewards"][0].endswith("examples/smollm2_addition.py:last_number_correct")
    with pytest.raises(ValueError, match="optim.foo"):
        runs.trl_own_defaults({"optim": {"foo": 1}}, {})
    silent = runs.trl_own_defaults({"optim": {"learning_rate": 1e-5}}, {})
    assert silent == {"learning_rate": 1e-5}  # nothing the recipe does not say
    pytest.importorskip("trl")
    from benchmarks.children import trl_grpo

    args = trl_grpo.build_config({**spec, "output_dir": str(tmp_path / "trl-s3")})
    assert (args.learning_rate, args.max_steps, args.seed, args.per_device_train_batch_size) == (1e-5, 40, 3, 16)
    assert str(args.lr_scheduler_type.value) == "constant" and args.bf16 is False
    assert args.adam_beta2 == 0.999 and args.save_strategy.value == "no" and args.logging_steps == 1  # TRL's default


def test_keep_best_keys_stay_out_of_trl_and_validation_is_training_rows(tmp_path):
    recipe = {"run": {"keep_best": True, "save_total_limit": 1, "early_stopping_patience": 2},
              "eval": {"data": "data/heldout.jsonl", "steps": 10}, "optim": {"learning_rate": 1e-5}}
    assert runs.trl_own_defaults(recipe, {}) == {"learning_rate": 1e-5}  # TRL keeps its last step's model
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"q{i}"}) + "\n" for i in range(40)))
    rows = runs.validation_file(train).read_text().splitlines()
    assert [json.loads(r)["prompt"] for r in rows] == [f"q{i}" for i in range(8, 40)]  # the last 32


def test_a_second_suite_on_the_same_campaign_is_refused(tmp_path):
    """One writer per campaign folder: while one suite holds it, another on the same --out stops, naming it."""
    first = learn_suite.claim_campaign(tmp_path)
    with pytest.raises(SystemExit, match="another learn_suite.py is writing this campaign"):
        learn_suite.claim_campaign(tmp_path)
    first.close()
    learn_suite.claim_campaign(tmp_path).close()  # free again once the first is done
