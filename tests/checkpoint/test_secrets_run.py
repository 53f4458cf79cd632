"""Tokens and keys in the environment, the config or the command line never reach the run folder
(config, metrics, completions, TensorBoard events, checkpoints, final model) or the console."""

from __future__ import annotations

import sys

import torch

from run_helpers import write_run
from slimgrpo.commands.cli import main

HF_SECRET = "hf_" + "Zq8RkT2mW4xY7vB1nC5pL9" * 2  # looks like a Hugging Face token
WANDB_SECRET = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"  # a secret by its variable's name only
CONFIG_SECRET = "sk-" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ"  # pasted into a config string
ARGV_SECRET = "ghp_" + "R2d2C3poBb8Luke5Leia7Han9"  # typed on the command line


def test_secrets_stay_out_of_every_file_and_the_console(tmp_path, tiny_model_dir, monkeypatch, capsys, caplog):
    monkeypatch.setenv("HF_TOKEN", HF_SECRET)
    monkeypatch.setenv("WANDB_API_KEY", WANDB_SECRET)
    cfg = write_run(tmp_path, tiny_model_dir, data={"system_prompt": f"The service key is {CONFIG_SECRET}."},
                    run={"max_steps": 2, "save_steps": 1}, log={"report_to": "tensorboard"})
    override = f"model.tokenizer_path={ARGV_SECRET}"
    # The preemption message repeats the command line: it must come out scrubbed.
    monkeypatch.setattr(sys, "argv", ["/x/slimgrpo/__main__.py", "train", str(cfg), f"data.system_prompt={HF_SECRET}"])
    monkeypatch.setenv("TEST_SIGNAL_AT_CALL", "TERM:1")
    threads = torch.get_num_threads()
    try:
        assert main(["train", str(cfg), f"data.system_prompt=key {CONFIG_SECRET} {HF_SECRET}"]) == 0
        monkeypatch.delenv("TEST_SIGNAL_AT_CALL")
        assert main(["train", str(cfg), f"data.system_prompt=key {CONFIG_SECRET} {HF_SECRET}"]) == 0
        # A secret in a value that ends up in an error message is redacted there too.
        assert main(["train", str(cfg), override]) == 2
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    console = out.out + out.err + caplog.text
    assert "run the same command again: slimgrpo train" in console and "data.system_prompt=<redacted>" in console
    assert "model.tokenizer_path '<redacted>' (relative to the working directory" in console  # (config/paths.py)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    assert any(p.name == "config.yaml" for p in files) and any("events.out.tfevents" in p.name for p in files)
    assert any("checkpoints" in p.parts for p in files) and (tmp_path / "run" / "final").is_dir()
    for secret in (HF_SECRET, WANDB_SECRET, CONFIG_SECRET, ARGV_SECRET):
        leaked = [str(p) for p in files if secret.encode() in p.read_bytes()]
        assert not leaked, f"secret found in {leaked}"
        assert secret not in console
