from pathlib import Path

import pytest
import yaml

from slimgrpo.config import (
    Config,
    ConfigError,
    check_context_length,
    field_docs,
    iter_fields,
    load_config,
    merge_overrides,
    parse_override,
    validate_config,
)

VALID = {
    "model": {"path": "m"},
    "data": {"path": "d.jsonl"},
    "rewards": {"functions": ["gsm8k_accuracy"]},
    "rollout": {"num_generations": 4},
    "run": {"batch_size": 8},
}


def write(tmp_path, data, name="c.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_yaml_and_overrides(tmp_path):
    cfg = load_config(write(tmp_path, VALID), ["loss.beta=0.04", "optim.learning_rate=1e-5", "lora.enabled=true",
                                                "rewards.functions=[a.py:f, format_strict]", "loss.epsilon_high=0.28"])
    assert cfg.loss.beta == 0.04
    assert cfg.optim.learning_rate == 1e-5
    assert cfg.lora.enabled is True
    # a file spec given on the command line is taken from the working directory (config/paths.py)
    assert cfg.rewards.functions == [str(Path.cwd() / "a.py") + ":f", "format_strict"]
    assert cfg.loss.epsilon_high == 0.28
    assert cfg.prompts_per_step == 2
    assert cfg.base_dir == str(tmp_path.resolve())


def test_yaml_scientific_notation_string_is_a_number(tmp_path):
    data = {**VALID, "optim": {"learning_rate": "1e-6"}}
    assert load_config(write(tmp_path, data)).optim.learning_rate == 1e-6


def test_every_field_has_a_docstring():
    missing = [key for key, _, _, doc in iter_fields() if not doc]
    assert not missing, f"fields without a docstring: {missing}"


def test_field_docs_reads_the_string_after_the_field():
    from slimgrpo.config import LossConfig

    assert "k3" in field_docs(LossConfig)["beta"]


@pytest.mark.parametrize("override, expected", [
    ("loss.betta=0.1", "loss.beta"),
    ("rollout.num_generation=4", "rollout.num_generations"),
    ("lora.rank=8", None),
    ("optim.lr=1e-5", None),
    ("beta=0.1", "loss.beta"),
])
def test_unknown_key_suggests_nearest(tmp_path, override, expected):
    with pytest.raises(ConfigError, match="unknown config key") as e:
        load_config(write(tmp_path, VALID), [override])
    if expected:
        assert expected in str(e.value)


def test_unknown_section_in_yaml(tmp_path):
    with pytest.raises(ConfigError, match="unknown config key 'rolout'"):
        load_config(write(tmp_path, {**VALID, "rolout": {"temperature": 1.0}}))


@pytest.mark.parametrize("override, fragment", [
    ("rollout.num_generations=1", "at least 2"),
    ("run.batch_size=10", "cannot hold whole groups"),
    ("rollout.temperature=-1", "temperature"),
    ("rollout.top_p=0", "top_p"),
    ("rollout.min_completion_length=999", "exceeds"),
    ("loss.loss_type=ppo", "not one of"),
    ("loss.delta=0.5", "delta"),
    ("loss.epsilon=1.5", r"loss\.epsilon must be in \(0, 1\)"),  # once refused only when the trainer was built
    ("loss.top_entropy_quantile=2", r"loss\.top_entropy_quantile must be in \[0, 1\]"),
    ("rewards.reward_weights=[1.0, 2.0]", "one weight per function"),
    ("memory.offload_activations=true", "gradient_checkpointing"),
    ("model.load_in_4bit=true", "lora.enabled"),
    ("rollout.num_generations=abc", "expected an integer"),
    ("lora.enabled=maybe", "true or false"),
    ("optim.learning_rate=0", "> 0"),
])
def test_validation_errors(tmp_path, override, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_config(write(tmp_path, VALID), [override])


def test_fsdp_takes_lora_and_refuses_a_4bit_base_with_the_alternative(tmp_path):
    cfg = load_config(write(tmp_path, VALID), ["distributed.strategy=fsdp", "lora.enabled=true"])
    assert cfg.distributed.strategy == "fsdp" and cfg.lora.enabled
    with pytest.raises(ConfigError, match=r"load_in_4bit \(QLoRA\).*bitsandbytes.*distributed.strategy=ddp"):
        load_config(write(tmp_path, VALID), ["distributed.strategy=fsdp", "lora.enabled=true", "model.load_in_4bit=true"])


def test_batch_size_error_proposes_valid_sizes(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, VALID), ["run.batch_size=10"])
    assert "run.batch_size=8" in str(e.value) and "12" in str(e.value)


def test_missing_required_paths(tmp_path):
    with pytest.raises(ConfigError, match="model.path"):
        load_config(write(tmp_path, {k: v for k, v in VALID.items() if k != "model"}))
    with pytest.raises(ConfigError, match="rewards.functions"):
        load_config(write(tmp_path, {k: v for k, v in VALID.items() if k != "rewards"}))


def test_malformed_yaml_names_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model:\n  path: m\n data: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line"):
        load_config(p)


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_override_syntax():
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("loss.beta")
    with pytest.raises(ConfigError, match="not a section"):
        merge_overrides({"loss": 3}, ["loss.beta=1"])


def test_context_length_checked_before_loading():
    cfg = Config()
    cfg.data.max_prompt_length = 400
    cfg.rollout.max_completion_length = 200
    with pytest.raises(ConfigError, match="at most 112"):
        check_context_length(cfg, 512, "tiny")
    check_context_length(cfg, 4096, "big")


def test_defaults_validate_once_paths_given():
    cfg = Config()
    cfg.model.path, cfg.data.path, cfg.rewards.functions = "m", "d", ["length"]
    validate_config(cfg)


def test_list_or_string_key_keeps_a_string(tmp_path):
    cfg = load_config(write(tmp_path, VALID), ["lora.target_modules=all-linear"])
    assert cfg.lora.target_modules == "all-linear"
    cfg = load_config(write(tmp_path, VALID), ["lora.target_modules=[q_proj, v_proj]"])
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]


def test_auto_token_chunk_bounds_the_logits_chunk():
    from slimgrpo.config import auto_token_chunk

    assert auto_token_chunk(151_936) == 64
    assert auto_token_chunk(1031) == 4096
    for v in (1000, 32_000, 151_936, 262_144):
        c = auto_token_chunk(v)
        assert c & (c - 1) == 0 and (c * v * 4 <= 64 * 2**20 or c == 16)


def test_the_objective_has_one_set_of_defaults_and_one_range_check():
    """``loss.LossSettings`` takes its defaults from ``LossConfig`` and its range check from the config's
    ``objective_problem``: a default or a bound changed in one place holds in the other."""
    import dataclasses
    import typing

    from slimgrpo.config.sections.loss import IMPORTANCE_SAMPLING_LEVELS, LOSS_TYPES, LossConfig, objective_problem
    from slimgrpo.loss.objectives import InvalidLossSetting, LossSettings
    from slimgrpo.loss.settings import loss_settings

    hints = typing.get_type_hints(LossConfig)
    assert typing.get_args(hints["loss_type"]) == LOSS_TYPES
    assert typing.get_args(hints["importance_sampling_level"]) == IMPORTANCE_SAMPLING_LEVELS
    config_defaults = dataclasses.asdict(LossConfig())
    for f in dataclasses.fields(LossSettings):
        if f.name != "max_completion_length":  # the rollout section's
            assert f.default == config_defaults[f.name], f.name
    cfg = Config()
    assert loss_settings(cfg) == LossSettings(max_completion_length=cfg.rollout.max_completion_length)
    bad = dataclasses.replace(LossConfig(), epsilon=1.5)
    assert objective_problem(bad, 16) == ("epsilon", "must be in (0, 1) (TRL: 0.2), got 1.5")
    with pytest.raises(InvalidLossSetting, match=r"^epsilon must be in \(0, 1\)") as e:
        LossSettings(epsilon=1.5)
    assert e.value.key == "epsilon" and isinstance(e.value, ValueError)
    from slimgrpo.config.validate import _validate_objective

    with pytest.raises(ConfigError, match=r"rollout\.max_completion_length must be set for loss_type='dr_grpo'"):
        _validate_objective(dataclasses.replace(LossConfig(), loss_type="dr_grpo"), None)
