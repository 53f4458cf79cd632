"""Bad input, one case at a time, against the output folder of a good run: each gives a one-paragraph
error that names the file, key or row and says what to do, a non-zero exit, a traceback only with
--debug, and leaves the earlier run's checkpoints byte-identical."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
import yaml

from conftest import build_tiny_model, build_tokenizer
from run_helpers import PROMPTS, file_hashes, write_run
from slimgrpo.commands.cli import main


@pytest.fixture(scope="module")
def good_run(tmp_path_factory, tiny_model_dir):
    """A finished 2-step run with checkpoints; the bad runs below all point at its output folder."""
    folder = tmp_path_factory.mktemp("good")
    cfg = write_run(folder, tiny_model_dir, run={"max_steps": 2, "save_steps": 1})
    threads = torch.get_num_threads()
    assert main(["train", str(cfg)]) == 0
    torch.set_num_threads(threads)
    run = folder / "run"
    return {"config": yaml.safe_load(cfg.read_text()), "run": run, "hashes": file_hashes(run / "checkpoints")}


def bad_run(tmp_path, good_run, capsys, *overrides, config_text=None, edit=None, debug=False):
    """Write a variant of the good config into tmp_path (same output_dir), run it, return stderr.
    Asserts exit 2 and that the good run's checkpoints did not change."""
    (tmp_path / "my_rewards.py").write_text((good_run["run"].parent / "my_rewards.py").read_text())
    (tmp_path / "prompts.jsonl").write_text((good_run["run"].parent / "prompts.jsonl").read_text())
    cfg = json.loads(json.dumps(good_run["config"]))
    if edit:
        edit(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(config_text if config_text is not None else yaml.safe_dump(cfg))
    threads = torch.get_num_threads()
    try:
        code = main((["--debug"] if debug else []) + ["train", str(path), *overrides])
    finally:
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    assert code == 2, err
    assert file_hashes(good_run["run"] / "checkpoints") == good_run["hashes"], "a bad run touched the checkpoints"
    if not debug:
        assert "Traceback" not in err
        message = err[err.index("error: "):]
        body = message.split("(run with --debug")[0].strip()
        assert "\n\n" not in body, f"not one paragraph:\n{body}"
    return err


def test_malformed_yaml(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, config_text="model:\n  path: [unclosed\nrun: {}\n")
    assert "bad.yaml" in err and "not valid YAML at line" in err


def test_unknown_key_suggests_the_nearest(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, "loss.betta=0.1")
    assert "unknown config key 'loss.betta'" in err and "'loss.beta'" in err and "--help-config" in err
    err = bad_run(tmp_path, good_run, capsys, edit=lambda c: c["run"].update(max_step=3))
    assert "unknown config key 'run.max_step'" in err and "'run.max_steps'" in err


def test_mistyped_value(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, "run.max_steps=ten")
    assert "run.max_steps: expected an integer, got 'ten'" in err
    err = bad_run(tmp_path, good_run, capsys, "rewards.on_error=ignore")
    assert "rewards.on_error" in err and "raise, zero, skip" in err


def test_missing_config_file(tmp_path, good_run, capsys):
    assert main(["train", str(tmp_path / "nope.yaml")]) == 2
    err = capsys.readouterr().err
    assert "nope.yaml" in err and "does not exist" in err and "Traceback" not in err


def test_missing_data_file(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, edit=lambda c: c["data"].update(path="missing.jsonl"))
    assert "missing.jsonl" in err and "does not exist" in err


def test_missing_reward_file(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, "rewards.functions=[nofile.py:score]")
    assert "nofile.py" in err
    # named with its key, the spec as written and the folder it was taken from (the working directory here)
    assert "rewards.functions \"['nofile.py:score']\" (relative to the working directory" in err


def test_empty_dataset(tmp_path, good_run, capsys):
    def edit(c):
        (tmp_path / "empty.jsonl").write_text("")
        c["data"]["path"] = "empty.jsonl"

    err = bad_run(tmp_path, good_run, capsys, edit=edit)
    assert "empty.jsonl" in err and "empty" in err.split("empty.jsonl", 1)[1]


def test_broken_jsonl_line(tmp_path, good_run, capsys):
    def edit(c):
        lines = [json.dumps(r) for r in PROMPTS]
        lines[2] = lines[2][:-5]  # cut off
        (tmp_path / "broken.jsonl").write_text("\n".join(lines) + "\n")
        c["data"]["path"] = "broken.jsonl"

    err = bad_run(tmp_path, good_run, capsys, edit=edit)
    assert "broken.jsonl: line 3 is not valid JSON" in err and "fix or delete that line" in err


def test_missing_prompt_column(tmp_path, good_run, capsys):
    def edit(c):
        rows = [{"question": r["prompt"], "answer": r["answer"]} for r in PROMPTS]
        (tmp_path / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        c["data"]["path"] = "q.jsonl"

    err = bad_run(tmp_path, good_run, capsys, edit=edit)
    assert "q.jsonl: row 1: no column 'prompt'" in err and "data.prompt_column=question" in err


def test_prompt_too_long_as_an_error_names_the_row(tmp_path, good_run, capsys):
    def edit(c):
        rows = PROMPTS[:3] + [{"prompt": "What is " + "one plus " * 40 + "one?", "answer": "41"}]
        (tmp_path / "long.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        c["data"].update(path="long.jsonl", prompt_overflow="error")

    err = bad_run(tmp_path, good_run, capsys, edit=edit)
    assert re.search(r"long.jsonl: row 4: prompt has \d+ tokens > data.max_prompt_length=32", err)
    assert "data.prompt_overflow=truncate|skip" in err


def test_every_prompt_too_long_with_skip(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, "data.prompt_overflow=skip", "data.max_prompt_length=2")
    assert "every prompt is longer than data.max_prompt_length=2" in err


@pytest.mark.parametrize("overflow", ["truncate", "skip"])
def test_long_prompts_truncated_or_skipped_are_counted(tmp_path, tiny_model_dir, caplog, overflow):
    long_row = {"prompt": "What is " + "one plus " * 40 + "one?", "answer": "41"}
    cfg = write_run(tmp_path, tiny_model_dir, prompts=PROMPTS[:4] + [long_row, long_row],
                    data={"prompt_overflow": overflow}, run={"max_steps": 1})
    threads = torch.get_num_threads()
    assert main(["train", str(cfg)]) == 0
    torch.set_num_threads(threads)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    key = "data/prompts_truncated" if overflow == "truncate" else "data/prompts_skipped"
    assert summary[key] == 2 and summary["data/prompts"] == (6 if overflow == "truncate" else 4)
    verb = "truncated" if overflow == "truncate" else "skipped"
    assert f"2 prompts longer than data.max_prompt_length=32 were {verb}" in caplog.text  # on the console


def test_model_folder_missing(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, f"model.path={tmp_path / 'no-model'}")
    assert "no-model" in err and "does not exist" in err


def test_model_folder_without_weights(tmp_path, good_run, capsys, tiny_model_dir):
    folder = tmp_path / "no-weights"
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy(f, folder / f.name)
    err = bad_run(tmp_path, good_run, capsys, f"model.path={folder}")
    assert "no-weights" in err and "no weights" in err


def test_model_folder_without_config(tmp_path, good_run, capsys):
    (tmp_path / "empty-model").mkdir()
    err = bad_run(tmp_path, good_run, capsys, f"model.path={tmp_path / 'empty-model'}")
    assert "empty-model" in err and "no config.json" in err


def test_resume_path_that_is_not_a_checkpoint(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, f"run.resume={tmp_path}")
    assert "run.resume=" in err and "not a usable slimgrpo checkpoint" in err


def test_resume_with_another_model_or_dataset(tmp_path, good_run, capsys):
    other = tmp_path / "other-model"
    other.mkdir()
    tok = build_tokenizer(other)
    build_tiny_model(other, vocab_size=len(tok), hidden=48)
    err = bad_run(tmp_path, good_run, capsys, f"model.path={other}")
    # The config check comes first: the checkpoint's config.yaml names the keys that changed.
    assert "cannot resume from" in err and "checkpoint-2" in err and f"model.path: '{good_run['config']['model']['path']}' -> '{other}'" in err
    assert "run.resume=never run.overwrite=true" in err and "run.output_dir" in err

    def edit(c):
        (tmp_path / "three.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PROMPTS[:3]))
        c["data"]["path"] = "three.jsonl"

    err = bad_run(tmp_path, good_run, capsys, edit=edit)
    # config.yaml holds paths resolved by the rule of config/paths.py: absolute
    assert f"data.path: '{good_run['run'].parent / 'prompts.jsonl'}' -> '{tmp_path / 'three.jsonl'}'" in err


def test_debug_shows_the_traceback(tmp_path, good_run, capsys):
    err = bad_run(tmp_path, good_run, capsys, "run.max_steps=ten", debug=True)
    assert "Traceback" in err and "run.max_steps: expected an integer" in err


def test_tokenizer_without_pad_token_falls_back_to_eos(tmp_path):
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "no-pad-model"
    folder.mkdir()
    build_tokenizer(folder)
    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    tok.pad_token = None
    tok.save_pretrained(str(folder))
    assert PreTrainedTokenizerFast.from_pretrained(str(folder)).pad_token is None
    build_tiny_model(folder, vocab_size=len(tok))
    cfg = write_run(tmp_path / "cfg", folder, run={"max_steps": 1})
    threads = torch.get_num_threads()
    try:
        assert main(["train", str(cfg)]) == 0
    finally:
        torch.set_num_threads(threads)
    assert (tmp_path / "cfg" / "run" / "final" / "model.safetensors").is_file()
