"""A TRL script with its import changed: ``from slimgrpo.trl import GRPOConfig, GRPOTrainer`` trains a tiny Qwen2 as
TRL's classes are called, and the same settings through the script, through ``slimgrpo train --trl-config`` and
through a slimgrpo YAML are the same run (metrics equal bit for bit)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from slimgrpo.trl import GRPOConfig, GRPOTrainer

ROWS = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(1, 7) for b in range(1, 5)]
REWARD = textwrap.dedent("""\
    def digits(completions, answer, **kwargs):
        return [float(sum(ch.isdigit() for ch in c)) / 10 + (1.0 if a in c else 0.0) for c, a in zip(completions, answer)]
""")
TIMED = ("time/", "memory/", "gen/tokens_per_s", "step_time")
SETTINGS = dict(per_device_train_batch_size=4, num_generations=4, max_completion_length=12, max_steps=3,
                learning_rate=1e-3, seed=7, logging_steps=1, use_cpu=True, bf16=False, beta=0.04)


@pytest.fixture
def workdir(tmp_path, tiny_chat_model_dir, monkeypatch):
    (tmp_path / "rw.py").write_text(REWARD)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(TIMED)} for r in rows]


def _script_trainer(workdir: Path, model, output: str, **extra):
    from datasets import Dataset
    from rw import digits

    args = GRPOConfig(output_dir=str(workdir / output), report_to="none", **{**SETTINGS, **extra})
    return GRPOTrainer(model=model, reward_funcs=digits, args=args, train_dataset=Dataset.from_list(ROWS))


def test_a_script_trains_with_the_import_changed(workdir, tiny_chat_model_dir):
    trainer = _script_trainer(workdir, str(tiny_chat_model_dir), "out")
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    output = trainer.train()
    assert output.global_step == trainer.state.global_step == 3
    steps = [h for h in trainer.state.log_history if "reward" in h]
    assert [h["step"] for h in steps] == [1, 2, 3]
    for name in ("loss", "reward", "reward_std", "rewards/digits/mean", "kl", "entropy", "grad_norm",
                 "learning_rate", "completions/mean_length", "clip_ratio/region_mean", "epoch"):
        assert name in steps[0], name  # TRL's metric names
    assert trainer.state.log_history[-1]["train_loss"] is not None
    assert all(not torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())
    trainer.save_model(str(workdir / "saved"))
    assert (workdir / "saved" / "model.safetensors").is_file() and (workdir / "saved" / "tokenizer.json").is_file()
    with pytest.raises(RuntimeError, match="never uploads"):
        trainer.push_to_hub()


def test_the_script_the_trl_yaml_and_the_slimgrpo_yaml_are_the_same_run(workdir, tiny_chat_model_dir):
    _script_trainer(workdir, str(tiny_chat_model_dir), "script").train()
    trl_yaml = {"model_name_or_path": str(tiny_chat_model_dir), "dataset_name": str(workdir / "train.jsonl"),
                "reward_funcs": ["rw.digits"], "output_dir": str(workdir / "trl_yaml"), "report_to": "none",
                **SETTINGS}
    (workdir / "grpo.yaml").write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in trl_yaml.items()))
    from slimgrpo.commands.cli import main

    assert main(["train", "--trl-config", str(workdir / "grpo.yaml")]) == 0
    saved = (workdir / "trl_yaml" / "config.yaml").read_text()  # the slimgrpo config that run wrote
    (workdir / "slim.yaml").write_text(saved.replace(str(workdir / "trl_yaml"), str(workdir / "slim")))
    assert main(["train", str(workdir / "slim.yaml")]) == 0
    script, yaml_run, slim = (_metrics(workdir / d) for d in ("script", "trl_yaml", "slim"))
    assert len(script) == 3 and script == yaml_run == slim


def test_callbacks_are_called_as_trls_trainer_calls_them(workdir, tiny_chat_model_dir):
    from transformers import TrainerCallback

    seen = []

    class Listener(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            seen.append("train_begin")

        def on_step_end(self, args, state, control, **kw):
            seen.append(f"step_end {state.global_step}")
            if state.global_step == 2:
                control.should_training_stop = True

        def on_log(self, args, state, control, logs=None, **kw):
            seen.append("log " + ("train_loss" if "train_loss" in logs else "step"))

        def on_save(self, args, state, control, **kw):
            seen.append(f"save {state.global_step}")

        def on_train_end(self, args, state, control, **kw):
            seen.append("train_end")

    trainer = _script_trainer(workdir, str(tiny_chat_model_dir), "cb")
    trainer.add_callback(Listener())
    trainer.train()
    assert seen == ["train_begin", "step_end 1", "log step", "step_end 2", "log step", "save 2", "log train_loss",
                    "train_end"]
    assert trainer.state.global_step == 2  # should_training_stop: no third step


def test_a_loaded_model_a_peft_config_and_a_peft_model(workdir, tiny_chat_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_chat_model_dir))
    trainer = _script_trainer(workdir, model, "loaded", max_steps=1)
    assert trainer.model is model  # the script's object is the one trained
    trainer.train()

    def adapters_moved(trainer) -> set[str]:
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
        assert moved and all("lora_" in n for n in moved), moved
        return moved

    peft = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    from rw import digits
    from datasets import Dataset

    given = GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=Dataset.from_list(ROWS),
                        args=GRPOConfig(output_dir=str(workdir / "peft"), **{**SETTINGS, "max_steps": 1}),
                        peft_config=peft)
    assert {n.split(".")[-4] for n in adapters_moved(given)} == {"q_proj", "v_proj"}
    wrapped = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_chat_model_dir)), peft)  # Unsloth's way
    adapters_moved(_script_trainer(workdir, wrapped, "wrapped", max_steps=1))
    with pytest.raises(ValueError, match="use_dora"):
        GRPOTrainer(model=str(tiny_chat_model_dir), reward_funcs=digits, train_dataset=ROWS,
                    args=GRPOConfig(output_dir=str(workdir / "x"), **SETTINGS),
                    peft_config=LoraConfig(r=4, use_dora=True))


def test_what_slimgrpo_cannot_honour_is_refused_where_the_script_says_it(workdir):
    with pytest.raises(ValueError, match=r"GRPOConfig\(vllm_mode='server'\)"):
        GRPOConfig(output_dir="x", use_vllm=True, vllm_mode="server")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        GRPOConfig(output_dir="x", bogus=1)
    with pytest.raises(ValueError, match="at least 2 generations"):
        GRPOConfig(output_dir="x", num_generations=1, per_device_train_batch_size=2)


def test_slimgrpo_trl_does_not_import_trl():
    probe = "import sys, slimgrpo.trl; print(sorted(m for m in sys.modules if m == 'trl' or m.startswith('trl.')))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_train_resumes_from_a_checkpoint_as_trl_takes_it(workdir, tiny_chat_model_dir):
    """``train(resume_from_checkpoint=...)``: True is the newest checkpoint of output_dir (an error where there is
    none, as TRL's), a folder is loaded over what the trainer was made with; either way the run goes on from
    that checkpoint's step with its weights, and the same steps come out as an uninterrupted run's (a constant
    schedule: TRL's linear one would end where each run's max_steps does)."""
    flat = {"lr_scheduler_type": "constant", "save_steps": 1}
    whole = _metrics_of(_script_trainer(workdir, str(tiny_chat_model_dir), "whole", **flat), workdir / "whole")
    with pytest.raises(ValueError, match="No valid checkpoint found in output directory"):
        _script_trainer(workdir, str(tiny_chat_model_dir), "fresh", **flat).train(resume_from_checkpoint=True)

    _script_trainer(workdir, str(tiny_chat_model_dir), "cut", **flat, max_steps=1).train()
    again = _script_trainer(workdir, str(tiny_chat_model_dir), "cut", **flat)  # went on from step 1 when made
    again.train(resume_from_checkpoint=True)
    assert again.state.global_step == 3 and _metrics(workdir / "cut") == whole

    _script_trainer(workdir, str(tiny_chat_model_dir), "other", **flat, max_steps=2).train()
    named = _script_trainer(workdir, str(tiny_chat_model_dir), "named", **flat)
    named.train(resume_from_checkpoint=str(workdir / "other" / "checkpoints" / "checkpoint-1"))
    assert named.state.global_step == 3
    assert _metrics(workdir / "named") == whole  # step 1's row comes with the checkpoint's history
    with pytest.raises(ValueError, match="not a complete checkpoint folder"):
        _script_trainer(workdir, str(tiny_chat_model_dir), "bad").train(resume_from_checkpoint=str(workdir))


def _metrics_of(trainer, run: Path) -> list[dict]:
    trainer.train()
    return _metrics(run)


def test_where_the_script_is_silent_trls_defaults_apply(workdir, tiny_chat_model_dir):
    """A TRL name means TRL's behaviour: a GRPOConfig that sets nothing trains with TRL 1.16's completion length,
    schedule, Adam beta2, checkpointing, logging and saving, and a LoraConfig without target_modules puts LoRA
    where peft puts it for the architecture (Qwen2: q_proj, v_proj), not on slimgrpo's all-linear."""
    from peft import LoraConfig

    from slimgrpo.config.trl_rules import TRL_DEFAULTS
    from slimgrpo.trl.configs import trl_default
    from slimgrpo.trl.grpo import run_config
    from rw import digits

    assert {k: trl_default(k) for k in TRL_DEFAULTS} == TRL_DEFAULTS  # fields.json, TRL 1.16's own
    cfg = run_config(GRPOConfig(output_dir=str(workdir / "d")), str(tiny_chat_model_dir), [digits],
                     peft_config=LoraConfig(r=4), datasets=(ROWS, None))
    assert cfg.rollout.max_completion_length == 512 and cfg.optim.lr_scheduler_type == "linear"
    assert cfg.optim.adam_beta2 == 0.999 and cfg.memory.gradient_checkpointing is True
    assert cfg.log.logging_steps == 10 and cfg.run.save_steps == 500
    assert cfg.lora.target_modules == ["q_proj", "v_proj"] and cfg.lora.dropout == 0.0  # LoraConfig's own 0.0
    slim = run_config(GRPOConfig(output_dir=str(workdir / "e"), max_completion_length=64, adam_beta2=0.99),
                      str(tiny_chat_model_dir), [digits], datasets=(ROWS, None))
    assert slim.rollout.max_completion_length == 64 and slim.optim.adam_beta2 == 0.99  # what the script sets wins


@pytest.mark.parametrize("trl, batch, slices, steps", [
    ({}, 8, None, 12),  # TRL's defaults: one generated batch = one optimizer step
    ({"gradient_accumulation_steps": 2}, 16, None, 12),
    ({"steps_per_generation": 4}, 32, 4, 3),  # 32 completions generated at once, 4 optimizer steps of 8 each
    ({"steps_per_generation": 4, "gradient_accumulation_steps": 2}, 32, 2, 6),
    ({"num_iterations": 2}, 8, None, 6),  # each generated batch used for 2 optimizer steps
    ({"steps_per_generation": 2, "num_iterations": 5}, 16, 2, 2),  # 12 / 10 optimizer steps a batch, rounded up
])
def test_trls_batch_and_step_counts_keep_their_meaning(trl, batch, slices, steps):
    """TRL counts optimizer steps of per_device_train_batch_size x gradient_accumulation_steps completions and
    generates steps_per_generation micro-batches at once; slimgrpo counts generated batches (run.batch_size) and
    the optimizer steps taken from each (steps_per_generation x num_iterations): the same run either way."""
    from slimgrpo.trl.yaml import convert

    values = convert({"model_name_or_path": "m", "per_device_train_batch_size": 8, "num_generations": 8,
                      "max_steps": 12, **trl}).values
    assert values["run.batch_size"] == batch and values.get("loss.steps_per_generation") == slices
    assert values["run.max_steps"] == steps
    refused = convert({"per_device_train_batch_size": 8, "steps_per_generation": 3, "gradient_accumulation_steps": 2})
    assert [r.key for r in refused.refused] == ["steps_per_generation"]
