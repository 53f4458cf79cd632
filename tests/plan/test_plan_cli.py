"""slimgrpo plan, and the plan check slimgrpo train runs before loading any weights."""

import pytest
import yaml

from slimgrpo.commands.cli import main
from slimgrpo.config import ConfigError, load_config
from slimgrpo.plan.admission import admit
from slimgrpo.plan.admission import overrides_for


def test_plan_preset_fits_and_exit_codes(capsys):
    assert main(["plan", "--model", "qwen2.5-0.5b", "rollout.num_generations=4", "run.batch_size=4",
                 "--budget", "80GiB"]) == 0
    out = capsys.readouterr().out
    assert "KV cache" in out and "peak" in out
    assert main(["plan", "--model", "llama-3.1-8b", "run.batch_size=8", "rollout.max_completion_length=20000",
                 "--budget", "80GiB"]) == 4
    out = capsys.readouterr().out
    assert "To fit the budget" in out and "memory.gradient_checkpointing=true" in out


def test_plan_unknown_preset_is_a_user_error(capsys):
    assert main(["plan", "--model", "llama-3.1-8bb"]) == 2
    assert "llama-3.1-8b" in capsys.readouterr().err


def test_plan_lists_presets(capsys):
    assert main(["plan", "--presets"]) == 0
    assert "qwen2.5-7b" in capsys.readouterr().out


def _cfg(tmp_path, model_dir, *overrides):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({
        "model": {"path": str(model_dir)}, "data": {"path": "unused.jsonl"}, "rewards": {"functions": ["length"]},
        "rollout": {"num_generations": 8, "max_completion_length": 256}, "run": {"batch_size": 64, "device": "cpu"},
    }))
    return load_config(p, list(overrides))


def test_train_refuses_a_run_over_budget_before_loading(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "memory.budget=1MiB")
    with pytest.raises(ConfigError, match="more than memory.budget=1MiB"):
        admit(cfg, show=False)


def test_train_refused_by_the_budget_exits_like_plan(tmp_path, tiny_model_dir, capsys):
    """'Does not fit' is exit 4 in train (memory.budget) as in plan (--budget): slimgrpo/exit_codes.py."""
    from slimgrpo.demo import EVAL_FILE

    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "model": {"path": str(tiny_model_dir)}, "data": {"path": str(EVAL_FILE), "max_prompt_length": 16},
        "rewards": {"functions": ["length"]},
        "rollout": {"num_generations": 8, "max_completion_length": 256},
        "run": {"batch_size": 64, "device": "cpu", "output_dir": str(tmp_path / "run")}}))
    assert main(["train", str(tmp_path / "c.yaml"), "memory.budget=1MiB"]) == 4
    assert "more than memory.budget=1MiB" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_memory_fit_applies_the_advice(tmp_path, tiny_model_dir):
    cfg = _cfg(tmp_path, tiny_model_dir, "memory.budget=450MiB", "memory.fit=true")
    admission = admit(cfg, show=False)
    new_cfg, plan = admission.cfg, admission.plan
    assert plan.peak_bytes <= 450 * 2**20
    assert (new_cfg.memory.gradient_checkpointing, new_cfg.memory.micro_batch_size) != (False, None)


def test_overrides_for_maps_planner_fields_to_config_keys():
    assert overrides_for({"lora": True, "micro_batch_rows": 4, "vocab_chunk": None}) == [
        "lora.enabled=true", "memory.micro_batch_size=4", "loss.vocab_chunk=null"]


def test_the_plan_headline_says_what_it_does_not_model(tmp_path, tiny_model_dir):
    """Packed update rows (the addition recipe: plan 6.21 GiB, measured 2.98 GiB). QLoRA keeps its compute
    dtype now, so there is no fp32-cast caveat any more."""
    from rich.console import Console

    from slimgrpo.plan.admission import not_modelled

    console = Console(record=True, width=300)
    cfg = _cfg(tmp_path, tiny_model_dir)
    admission = admit(cfg, console=console)
    plan = admission.plan
    line = console.export_text()
    assert line.startswith("memory plan: peak") and "an upper bound" in line and "packed update rows" in line
    assert not any("packed" in c for c in not_modelled(_cfg(tmp_path, tiny_model_dir,
                                                              "memory.gradient_checkpointing=true"), plan))
    qlora = _cfg(tmp_path, tiny_model_dir, "model.load_in_4bit=true", "lora.enabled=true")
    assert not any("QLoRA" in c for c in not_modelled(qlora, plan))


def test_plan_trace_prints_no_third_party_warnings(tmp_path, tiny_model_dir):
    """transformers' `past_key_values` FutureWarnings and torchao's import logs stay out of the terminal, as in
    train (log.verbose=true shows them)."""
    import subprocess
    import sys

    _cfg(tmp_path, tiny_model_dir)
    proc = subprocess.run([sys.executable, "-m", "slimgrpo", "plan", str(tmp_path / "c.yaml"),
                           "rollout.max_completion_length=8", "rollout.num_generations=2", "run.batch_size=2",
                           "data.max_prompt_length=8", "--trace"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "trace / plan" in proc.stdout
    assert "Warning" not in proc.stderr and "WARNING" not in proc.stderr, proc.stderr


def test_overrides_may_follow_the_flags(capsys):
    """`slimgrpo plan --model X --budget B key=value`: argparse alone would call key=value unrecognized."""
    assert main(["plan", "--model", "qwen2.5-0.5b", "--budget", "80GiB", "rollout.num_generations=4",
                 "run.batch_size=4", "rollout.max_completion_length=64"]) == 0
    assert "x 64 tokens" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:  # argparse's usage error, as before
        main(["plan", "--model", "qwen2.5-0.5b", "--nope"])
    assert e.value.code == 2 and "unrecognized arguments: --nope" in capsys.readouterr().err
