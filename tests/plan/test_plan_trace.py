"""``slimgrpo plan --trace`` on a tiny config: the trace table beside the plan, and what it cannot see."""

import pytest
import yaml

from slimgrpo.commands.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(tmp_path, model_dir, **sections):
    p = tmp_path / "c.yaml"
    cfg = {"model": {"path": str(model_dir), "dtype": "float32"}, "data": {"path": "unused.jsonl", "max_prompt_length": 7},
           "rewards": {"functions": ["length"]},
           "rollout": {"num_generations": 3, "max_completion_length": 37}, "run": {"batch_size": 3, "device": "cpu"},
           "loss": {"token_chunk": 16}}
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_plan_trace_prints_trace_beside_plan(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # rich wraps long cells at the default 80
    cfg = _config(tmp_path, tiny_model_dir, lora={"enabled": True, "r": 4},
                  memory={"gradient_checkpointing": True})
    assert main(["plan", str(cfg), "--trace", "--budget", "64GiB"]) == 0
    out = capsys.readouterr().out
    assert "Memory plan" in out and "Trace: one step on fake tensors" in out
    for line in ("weights + adapters", "optimizer state", "KV cache, prefill, sampling", "tensor peak"):
        assert line in out
    assert "trace / plan =" in out and "device peak from the trace" in out
    assert "the trace cannot see" in out and "allocator caching" in out and "Python / torch runtime" in out
    assert "by the trace the run fits" in out


def test_plan_trace_on_cuda_adds_the_margin(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    cfg = _config(tmp_path, tiny_model_dir, model={"dtype": "bfloat16"})
    assert main(["plan", str(cfg), "--trace", "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "CUDA context" in out and "allocator margin 10%" in out


def test_plan_help_mentions_trace(capsys):
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "--trace" in out and "fake tensors" in out


def test_memory_fit_trace_checks_the_fit_by_trace(tmp_path, tiny_model_dir, capsys):
    from slimgrpo.config import load_config
    from slimgrpo.plan.admission import admit
    from slimgrpo.plan.admission import trace_config
    from slimgrpo.runspec.shape import load_shape

    p = _config(tmp_path, tiny_model_dir, memory={"budget": "420MiB", "fit": "trace"})
    cfg = load_config(p)
    assert cfg.memory.fit == "trace"
    admission = admit(cfg, show=True)
    new_cfg, plan = admission.cfg, admission.plan
    out = capsys.readouterr().out
    assert "memory.fit=trace:" in out and "traced peak" in out
    assert trace_config(new_cfg, load_shape(str(tiny_model_dir)), "cpu").device_peak_bytes <= 420 * 2**20
