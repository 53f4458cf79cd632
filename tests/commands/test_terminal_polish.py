"""Small things a new user meets: eval --compare headers, deltas and standard errors, clear errors for a
missing model and for --adapter-only on a full model, units in plan, the context-length advice, and a
quiet exit when stdout's reader goes away."""

import subprocess
import sys

import pytest

import slimgrpo
from slimgrpo.commands.cli import main
from slimgrpo.config import Config, ConfigError, check_context_length
from slimgrpo.units import column_labels
from slimgrpo.evaluate import standard_error
from slimgrpo.units import human_count, human_duration


def test_compare_headers_keep_the_distinguishing_parts():
    a, b = "/data/runs/alpha-lr1e-5/checkpoints/checkpoint-40", "/data/runs/beta-lr3e-5/checkpoints/checkpoint-40"
    la, lb = column_labels([a, b])
    assert la != lb and "alpha" in la and "beta" in lb and la.endswith("checkpoint-40")
    assert column_labels(["out/run/checkpoints/checkpoint-20", "out/run/checkpoints/checkpoint-40"]) == \
        ["checkpoint-20", "checkpoint-40"]
    long = column_labels(["models/" + "x" * 80 + "/final"])[0]
    assert len(long) <= 28 and long.endswith("/final")


def test_eval_compare_shows_change_stderr_and_decoding(capsys):
    from slimgrpo.demo import EVAL_FILE, MODEL_DIR

    rc = main(["eval", "data.max_prompt_length=16", "rollout.max_completion_length=8", "rollout.temperature=0.7",
               "--model", str(MODEL_DIR), "--compare", str(MODEL_DIR) + "/", "--data", str(EVAL_FILE),
               "--rewards", "slimgrpo.demo.task:demo_accuracy", "--num-samples", "1", "--limit", "12"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "12 prompts: 1 sample per prompt, temperature 0.7" in out and "1 samples" not in out
    assert "change" in out and "±" in out and "+0.0000" in out  # the same model twice: no change
    assert "…" not in out.split("\n")[1]  # headers not cut


def test_standard_error_against_the_formula():
    vals = [0.0, 1.0, 1.0, 0.0, 1.0]
    mean = sum(vals) / 5
    assert standard_error(vals) == pytest.approx((sum((v - mean) ** 2 for v in vals) / 4) ** 0.5 / 5 ** 0.5)
    assert standard_error([1.0]) != standard_error([1.0])  # NaN


def test_eval_missing_model_is_a_clear_error(capsys, tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hi"}\n')
    assert main(["eval", "--model", "missing/", "--data", str(tmp_path / "p.jsonl"), "--rewards", "length"]) == 2
    err = capsys.readouterr().err
    assert "--model 'missing/' (relative to the working directory" in err and "does not exist" in err \
        and "Repo id" not in err


@pytest.mark.parametrize("argv, says", [
    (["train"], "give a CONFIG file"),
    (["plan"], "give a CONFIG file or --model"),
    (["eval"], "give --model PATH"),
    (["report"], "required: RUN_DIR"),
    (["export", "somewhere"], "required: --out"),
    (["demo", "--task", "chess"], "invalid choice"),
    ([], "COMMAND"),
])
def test_usage_errors_exit_2(argv, says, capsys, tmp_path, monkeypatch):
    """A missing argument is bad input like any other: exit 2 with a sentence, never 1."""
    monkeypatch.chdir(tmp_path)  # eval reads no config; nothing is written here
    try:
        rc = main(argv)
    except SystemExit as e:  # argparse's own usage errors exit 2 themselves
        rc = e.code
    assert rc == 2
    out = capsys.readouterr()
    assert says in out.err + out.out


def test_export_adapter_only_refuses_a_full_model(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "out"
    assert main(["export", str(tiny_model_dir), "--out", str(out), "--adapter-only"]) == 2
    assert "full model" in capsys.readouterr().err
    assert not out.exists() or not any(out.iterdir())


def test_units():
    assert human_count(132_000) == "132K" and human_count(494_032_768) == "494M"
    assert human_count(7.6e9) == "7.6B" and human_count(950) == "950"
    assert human_duration(5.25) == "5.2 s" and human_duration(754) == "12 min 34 s"
    assert human_duration(7384) == "2 h 3 min"


def test_plan_small_model_counts_and_units(tmp_path, tiny_model_dir, capsys):
    # within the tiny model's 512 positions (the defaults, 512 + 256, are refused: test_position_limit.py)
    assert main(["plan", "--model", str(tiny_model_dir), "run.batch_size=8", "rollout.num_generations=4",
                 "data.max_prompt_length=256", "--budget", "1KiB"]) == 4
    out = capsys.readouterr().out
    assert "0.00B" not in out and "K parameters" in out
    # the fit's advice (the "memory tricks" list above it uses the same bullets, without sizes)
    advice = [ln for ln in out.split("cheapest first:", 1)[-1].splitlines() if ln.strip().startswith("- ")]
    assert advice and all(ln.rstrip().endswith("GiB") for ln in advice)


def test_context_error_when_the_prompt_alone_fills_it():
    cfg = Config()
    cfg.data.max_prompt_length, cfg.rollout.max_completion_length = 512, 64
    with pytest.raises(ConfigError) as e:
        check_context_length(cfg, 512, "m")
    assert "at most 0" not in str(e.value) and "alone" in str(e.value)
    cfg.data.max_prompt_length = 500
    with pytest.raises(ConfigError, match="at most 12"):
        check_context_length(cfg, 512, "m")


SRC = str(__import__("pathlib").Path(slimgrpo.__file__).parents[1])


def test_broken_pipe_is_quiet():
    proc = subprocess.run(f"{sys.executable} -m slimgrpo train --help-config | head -2", shell=True,
                          capture_output=True, text=True, env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"})
    assert proc.stderr == "" and "[model]" in proc.stdout
