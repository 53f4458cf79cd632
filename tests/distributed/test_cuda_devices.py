"""Which GPU a run uses, read without a GPU: CUDA's queries are patched to describe a machine with four
GPUs whose current device is 2 (as under torchrun, where ``process_group.init_process_group`` sets the current
device from LOCAL_RANK). Each test fails where ``cuda`` means "no index": there
the 4-bit loader's ``device_map`` then fell back to GPU 0 on every rank, ``memory.budget=auto`` read the
current GPU whatever ``run.device`` said, and ``memory/peak_mib`` was the allocated bytes alone."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.config import Config, ConfigError, validate_config
from slimgrpo.config.sections.model import ModelConfig
from slimgrpo.plan import admission
from slimgrpo.modeling import ModelLoadError, load_model, resolve_device
from slimgrpo.output.metrics import memory_metrics


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)


@pytest.mark.parametrize("name, index", [("auto", 2), ("cuda", 2), ("cuda:3", 3), ("cuda:0", 0)])
def test_cuda_devices_always_carry_the_ranks_index(four_gpus, name, index):
    assert resolve_device(name) == torch.device("cuda", index)


def test_a_device_index_the_machine_lacks_is_refused_at_validation_and_at_load(four_gpus):
    cfg = Config()
    cfg.model.path, cfg.data.path, cfg.rewards.functions = "some/model", "prompts.jsonl", ["gsm8k_accuracy"]
    cfg.run.device = "cuda:7"
    with pytest.raises(ConfigError, match=r"run.device='cuda:7'.*4 CUDA device"):
        validate_config(cfg)
    with pytest.raises(ModelLoadError, match="4 CUDA device"):
        resolve_device("cuda:7")
    cfg.run.device = "gpu"
    with pytest.raises(ConfigError, match="not a device"):
        validate_config(cfg)


def test_four_bit_weights_load_on_the_ranks_own_gpu(four_gpus, monkeypatch, tmp_path):
    """QLoRA under torchrun: ``device_map`` names the current device (2), not GPU 0."""
    import transformers

    seen = {}

    class Loaded(Exception):
        pass

    def fake_from_pretrained(path, **kwargs):
        seen.update(kwargs)
        raise Loaded

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(transformers, "BitsAndBytesConfig", lambda **kw: ("bnb", kw))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr("slimgrpo.modeling.check_weights_present", lambda path: None)
    with pytest.raises(Loaded):
        load_model(ModelConfig(path=str(tmp_path), load_in_4bit=True), resolve_device("auto"), torch.bfloat16)
    assert seen["device_map"] == {"": 2}


def test_budget_auto_reads_the_gpu_run_device_names(four_gpus, monkeypatch):
    asked = []

    def mem_get_info(index=None):
        asked.append(index)
        return (10 * 2**30 + (index or 0), 80 * 2**30)

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    assert admission.budget_bytes("auto", "cuda", "cuda:1") == 10 * 2**30 + 1
    assert admission.budget_bytes("auto", "cuda", "auto") == 10 * 2**30 + 2  # the current (the rank's) GPU
    assert asked == [1, 2]


def test_memory_metrics_on_cuda_include_reserved_and_pinned_host_bytes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**30)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * 2**30)
    monkeypatch.setattr(torch.cuda, "host_memory_stats", lambda: {"allocated_bytes.peak": 2**30})
    m = memory_metrics(torch.device("cuda", 0))
    assert m["memory/peak_mib"] == 3072 and m["memory/peak_reserved_mib"] == 4096
    assert m["memory/pinned_host_peak_mib"] == 1024 and m["memory/host_peak_rss_mib"] > 0
    assert set(memory_metrics(torch.device("cpu"))) == {"memory/peak_mib"}  # CPU: peak RSS, as before
