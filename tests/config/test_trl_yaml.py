"""``slimgrpo train --trl-config``: every TRL 1.16 field has a rule, the mapping targets exist, a YAML of TRL's
defaults converts cleanly, the example TRL YAML trains unchanged, and TRL names get hints."""

import dataclasses
import json

import pytest

trl = pytest.importorskip("trl")

from slimgrpo.config import ConfigError, all_keys, load_config, unknown_key_message  # noqa: E402
from slimgrpo.trl import BY_KEY, RULES, convert, load_trl_config  # noqa: E402
from slimgrpo.config.trl_rules import TRL_DEFAULTS  # noqa: E402

# Targets a TRL key may name that this config does not have: ignored at TRL's default, never refused.
PENDING: set[str] = set()  # targets of keys whose slimgrpo side is not built yet (none now)


def trl_classes():
    from trl.scripts.grpo import GRPOScriptArguments
    from trl.scripts.utils import DatasetMixtureConfig

    return [trl.GRPOConfig, trl.ModelConfig, GRPOScriptArguments, DatasetMixtureConfig]


def trl_defaults() -> dict:
    out = {}
    for cls in trl_classes():
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out.setdefault(f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                out.setdefault(f.name, f.default_factory())
    return out


def test_every_trl_field_has_a_rule():
    names = [f.name for cls in trl_classes() for f in dataclasses.fields(cls)]
    assert len(names) > 200  # GRPOConfig includes every inherited TrainingArguments field
    missing = sorted(set(names) - set(BY_KEY))
    assert not missing, f"TRL keys without a rule: {missing}"


def test_mapping_targets_are_config_keys():
    keys = set(all_keys())
    for rule in RULES:
        for target in rule.targets:
            if target in PENDING:
                continue
            assert target in keys, f"{rule.key} -> {target} is not a slimgrpo key"
        assert rule.note or rule.kind == "map", f"{rule.key}: ignored/refused without a reason"


def test_trl_defaults_used_here_match_trl():
    defaults = trl_defaults()
    for key, value in TRL_DEFAULTS.items():
        assert defaults[key] == value, key


def test_a_yaml_of_all_trl_defaults_converts_without_refusals():
    values = trl_defaults()
    values["output_dir"] = "out"
    result = convert(values)
    refused = {r.key: r.detail for r in result.refused}
    # Keys whose slimgrpo target is not on this branch are "ignored" at TRL's default, never refused.
    assert not refused, refused
    assert {r.key for r in result.rows} >= set(values)


@pytest.mark.parametrize("trl_values, expected", [
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 4},
     {"run.batch_size": 16, "memory.micro_batch_size": 4}),
    ({"bf16": True, "lora_r": 8, "use_peft": True}, {"model.dtype": "bfloat16", "lora.r": 8, "lora.enabled": True}),
    ({"max_steps": -1, "num_train_epochs": 2}, {"run.num_train_epochs": 2.0}),
    ({"max_steps": 10, "num_train_epochs": 2}, {"run.max_steps": 10}),
    ({"scale_rewards": False, "min_p": None}, {"loss.scale_rewards": "none", "rollout.min_p": 0.0}),
    ({"optim": "paged_adamw_8bit", "warmup_steps": 0.1}, {"memory.optimizer": "adamw_8bit", "optim.warmup_steps": 0.1}),
    ({"torch_dtype": "bfloat16", "max_prompt_length": 256, "warmup_ratio": 0.05},
     {"model.dtype": "bfloat16", "data.max_prompt_length": 256, "optim.warmup_ratio": 0.05}),
])
def test_values_map(trl_values, expected):
    result = convert(trl_values)
    assert not result.refused, result.refused
    for key, value in expected.items():
        assert result.values[key] == value, key
    if "max_steps" in trl_values and trl_values["max_steps"] > 0:
        assert "run.num_train_epochs" not in result.values


def test_defaults_applied_when_silent():
    result = convert({"model_name_or_path": "m"})
    assert result.values["run.num_train_epochs"] == 3.0 and result.values["run.batch_size"] == 8
    assert result.values["run.output_dir"] == "trainer_output"


@pytest.mark.parametrize("trl_values, key", [
    ({"use_dora": True}, "use_dora"),
    ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type"),
    ({"optim": "sgd"}, "optim"),
    ({"no_such_key": 1}, "no_such_key"),
    ({"reward_funcs": ["nonsense"]}, "reward_funcs"),
])
def test_refusals(trl_values, key, tmp_path):
    assert [r.key for r in convert(trl_values).refused] == [key]
    path = tmp_path / "grpo.yaml"
    path.write_text(json.dumps({"model_name_or_path": "m", "dataset_name": "d.jsonl",
                                "reward_funcs": ["think_format_reward"], **trl_values}))
    with pytest.raises(ConfigError, match=key):
        load_trl_config(path, show=lambda text: None)


def test_ok_values_are_accepted():
    result = convert({"use_dora": False, "model_revision": "main", "push_to_hub": False, "vllm_group_port": 51216})
    assert not result.refused and all(r.status == "ignored" for r in result.rows[:4])


def test_trl_vllm_keys_map_onto_the_colocated_engine():
    """use_vllm selects rollout.engine=vllm (colocated, TRL 1.16's default vllm_mode); server mode is refused;
    the importance-sampling keys map one to one, the deprecated cap winning over clip_max as in TRL."""
    result = convert({"use_vllm": True, "vllm_mode": "colocate", "vllm_importance_sampling_mode": "token_mask",
                      "vllm_importance_sampling_clip_max": 2.0, "vllm_importance_sampling_clip_min": 0.5,
                      "vllm_enable_sleep_mode": False, "vllm_gpu_memory_utilization": 0.4,
                      "vllm_tensor_parallel_size": 1, "vllm_server_port": 8000})
    assert not result.refused
    v = result.values
    assert (v["rollout.engine"], v["rollout.importance_sampling_mode"], v["rollout.importance_sampling_cap"],
            v["rollout.importance_sampling_min"], v["rollout.vllm_sleep_mode"],
            v["rollout.vllm_gpu_memory_utilization"]) == ("vllm", "token_mask", 2.0, 0.5, False, 0.4)
    assert convert({"use_vllm": False}).values.get("rollout.engine") is None  # slimgrpo's own choice stays
    both = convert({"vllm_importance_sampling_clip_max": 2.0, "vllm_importance_sampling_cap": 5.0}).values
    assert both["rollout.importance_sampling_cap"] == 5.0
    server = convert({"use_vllm": True, "vllm_mode": "server"})
    assert [r.key for r in server.refused] == ["vllm_mode"] and "colocated" in server.refused[0].detail
    assert not convert({"use_vllm": False, "vllm_mode": "server"}).refused  # no vLLM asked: nothing to refuse
    assert [r.key for r in convert({"vllm_tensor_parallel_size": 2}).refused] == ["vllm_tensor_parallel_size"]


@pytest.mark.parametrize("key, expect", [
    ("gradient_accumulation_steps", "run.batch_size"),
    ("run.gradient_accumulation_steps", "memory.micro_batch_size"),
    ("bf16", "model.dtype"),
    ("learning_rate", "optim.learning_rate"),
    ("per_device_train_batch_size", "memory.micro_batch_size"),
    ("use_vllm", "rollout.engine"),
])
def test_unknown_key_hints_name_slimgrpo_keys(key, expect):
    message = unknown_key_message(key)
    assert expect in message and "TRL" in message
    with pytest.raises(ConfigError, match="TRL"):
        load_config(None, [f"{key}=1"], validate=False)


def test_example_trl_yaml_trains_unchanged(tmp_path):
    from run_helpers import cli

    from conftest import EXAMPLES

    out = tmp_path / "run"
    proc = cli("train", "--trl-config", str(EXAMPLES / "trl_grpo.yaml"), "max_steps=2", f"output_dir={out}",
               "log.progress=false", "run.save_model=false", "logging_steps=1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mapped" in proc.stdout and "reward_funcs" in proc.stdout
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for key in ("rewards/exact_answer/mean", "rewards/soft_overlong_punishment_reward/mean", "exact_answer/solved"):
        assert key in records[-1], key
    samples = [json.loads(ln) for ln in (out / "completions.jsonl").read_text().splitlines()]
    assert samples and "gold" in samples[0]


def test_migration_doc_table_is_generated_from_the_rules():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gen_trl_migration.py"
    proc = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
