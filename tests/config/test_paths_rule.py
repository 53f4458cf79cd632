"""The one rule for relative paths (config/paths.py): in a config file, from the file's folder; on the
command line (key=value, --flags), from the working directory; the same in every command; errors name the
key or flag, the path as written and the folder it was resolved against."""

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from slimgrpo.commands.cli import main
from slimgrpo.config import load_config
from slimgrpo.config.paths import same_path

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def project(tmp_path, monkeypatch, tiny_model_dir):
    """configs/run.yaml naming ../models/tiny, prompts.jsonl beside it, r.py:score beside it; cwd = elsewhere."""
    from slimgrpo.demo import EVAL_FILE

    (tmp_path / "models").mkdir()
    shutil.copytree(tiny_model_dir, tmp_path / "models" / "tiny")
    conf = tmp_path / "configs"
    conf.mkdir()
    shutil.copy(EVAL_FILE, conf / "prompts.jsonl")
    (conf / "r.py").write_text("def score(prompts, completions, **kw):\n"
                               "    return [float(len(c) % 2) for c in completions]\n")
    (conf / "run.yaml").write_text(yaml.safe_dump({
        "model": {"path": "../models/tiny"}, "data": {"path": "prompts.jsonl", "max_prompt_length": 16},
        "rollout": {"num_generations": 2, "max_completion_length": 4},
        "rewards": {"functions": ["r.py:score", "length"]},
        "run": {"output_dir": "../outputs/run", "max_steps": 1, "batch_size": 4, "device": "cpu",
                "max_collapsed_steps": 0},  # a random tiny model: its "collapse" is not what these tests are about
        "log": {"progress": False}}))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return tmp_path


def test_file_paths_from_the_file_overrides_from_the_working_directory(project):
    cfg = load_config(project / "configs" / "run.yaml", ["eval.data=held.jsonl", "model.tokenizer_path=~/tok"])
    assert cfg.model.path == str(project / "models" / "tiny")
    assert cfg.data.path == str(project / "configs" / "prompts.jsonl")
    assert cfg.run.output_dir == str(project / "outputs" / "run")
    assert cfg.rewards.functions == [str(project / "configs" / "r.py") + ":score", "length"]
    assert cfg.eval.data == str(project / "work" / "held.jsonl")  # typed on the command line, in work/
    assert cfg.model.tokenizer_path == os.path.expanduser("~/tok")
    origin = cfg.path_origins["model.path"]
    assert (origin.written, origin.base, origin.source) == ("../models/tiny", str(project / "configs"), "config file")
    assert cfg.path_origins["eval.data"].source == "command line"
    hub = load_config(project / "configs" / "run.yaml", ["model.path=Qwen/Qwen2.5-0.5B-Instruct"])
    assert hub.model.path == "Qwen/Qwen2.5-0.5B-Instruct"  # a hub name stays a hub name
    module = load_config(project / "configs" / "run.yaml", ["rewards.functions=[pkg.mod:fn]"])
    assert module.rewards.functions == ["pkg.mod:fn"]


def test_resume_reads_an_older_config_yaml_written_with_relative_paths(tmp_path):
    assert same_path("../models/tiny", "/x/models/tiny") and same_path("r.py:score", "/x/c/r.py:score")
    assert same_path(["r.py:score", "length"], ["/x/r.py:score", "length"])
    assert not same_path("../models/tiny", "/x/models/other") and not same_path("/a/m", "/b/m")


def test_train_and_eval_agree_and_the_run_lands_where_the_file_says(project, capsys):
    assert main(["train", str(project / "configs" / "run.yaml")]) == 0
    run = project / "outputs" / "run"
    assert (run / "final").is_dir() and not (project / "work" / "outputs").exists()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["path"] == str(project / "models" / "tiny")  # absolute: same meaning from anywhere
    # eval without --model takes the YAML's model.path, resolved by the same rule
    out = project / "work" / "e.json"
    assert main(["eval", str(project / "configs" / "run.yaml"), "--limit", "3", "--num-samples", "2",
                 "--json", "e.json", "--json-samples", "2"]) == 0
    assert f"model: {project / 'models' / 'tiny'}" in capsys.readouterr().out
    result = json.loads(out.read_text())[str(project / "models" / "tiny")]
    assert 0 <= result["accuracy"] <= 1 and len(result["samples"]) == 2
    sample = result["samples"][0]
    assert sample["prompt"] and "answer" in sample and len(sample["completions"]) == 2
    first = sample["completions"][0]
    assert set(first) == {"text", "score", "correct", "rewards"} and set(first["rewards"]) == {"score", "length"}
    assert sample["correct"] == sum(c["correct"] for c in sample["completions"])
    # resuming with the same file from another working directory changes nothing
    os.chdir(project)
    assert main(["train", "configs/run.yaml"]) == 0
    assert "already finished" in capsys.readouterr().out


def test_eval_path_errors_name_the_key_or_flag_and_the_folder(project, capsys):
    conf = project / "configs" / "run.yaml"
    text = conf.read_text().replace("../models/tiny", "../models/missing")
    conf.write_text(text)
    assert main(["eval", str(conf), "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "model.path '../models/missing'" in err and str(project / "configs") in err
    assert "--model" not in err.split("\n")[0].split(":")[0]
    assert main(["eval", str(conf), "--model", "nowhere/final/x", "--limit", "1"]) == 2
    err = capsys.readouterr().err
    assert "--model 'nowhere/final/x' (relative to the working directory" in err and str(project / "work") in err
    assert main(["eval", str(conf), "--model", str(project / "models" / "tiny"), "--data", "none.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "--data 'none.jsonl' (relative to the working directory" in err
    for command in ("train", "plan"):
        assert main([command, str(conf)]) == 2
        err = capsys.readouterr().err
        assert "model.path '../models/missing' (relative to the config file's folder" in err, command
    assert main(["eval", str(conf), "--model", str(project / "models" / "tiny"), "--json", "x.json",
                 "--json-samples", "-1"]) == 2
    assert "--json-samples" in capsys.readouterr().err


def test_a_missing_relative_data_file_is_a_path_not_a_hub_name(project, capsys):
    """``data/heldout.jsonl`` has the shape of ``org/name`` but names a file: missing, the error says which key
    and the folder it was taken from (the config file's), not a hub lookup from the working directory."""
    from slimgrpo.config.paths import looks_like_hub_name

    assert looks_like_hub_name("Qwen/Qwen2.5-0.5B") and looks_like_hub_name("openai/gsm8k")
    assert not looks_like_hub_name("data/heldout.jsonl") and not looks_like_hub_name("models/x.gguf")
    conf = project / "configs" / "run.yaml"
    conf.write_text(conf.read_text() + "eval:\n  data: data/heldout.jsonl\n")
    assert main(["train", str(conf)]) == 2
    err = capsys.readouterr().err
    assert "eval.data 'data/heldout.jsonl' (relative to the config file's folder" in err
    assert str(project / "configs" / "data" / "heldout.jsonl") + " does not exist" in err


def test_critic_path_that_does_not_exist_names_the_key(project, capsys):
    conf = project / "configs" / "run.yaml"
    assert main(["train", str(conf), "loss.advantage_estimator=gae", "critic.model_path=critic-model"]) == 2
    err = capsys.readouterr().err
    assert "critic.model_path 'critic-model' (relative to the working directory" in err
    assert "Repo id" not in err


def test_a_run_folder_written_before_paths_were_absolute_resumes(project, capsys):
    """Its config.yaml holds paths as written (../models/tiny, prompts.jsonl, r.py:score): the same paths as the
    absolute ones a resume resolves, not a changed config."""
    conf = project / "configs" / "run.yaml"
    assert main(["train", str(conf), "run.save_steps=1"]) == 0
    run = project / "outputs" / "run"
    for saved in run.rglob("config.yaml"):
        data = yaml.safe_load(saved.read_text())
        data["model"]["path"], data["data"]["path"] = "../models/tiny", "prompts.jsonl"
        data["rewards"]["functions"] = ["r.py:score", "length"]
        saved.write_text(yaml.safe_dump(data, sort_keys=False))
        marker = saved.parent / "COMPLETE"  # a checkpoint's manifest records each file's size
        if marker.is_file():
            manifest = json.loads(marker.read_text())
            manifest["files"]["config.yaml"] = saved.stat().st_size
            marker.write_text(json.dumps(manifest))
    capsys.readouterr()
    assert main(["train", str(conf), "run.max_steps=2"]) == 0, capsys.readouterr().err
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert steps[-1] == 2
    # a really different model is still refused
    other = project / "models" / "other"
    shutil.copytree(project / "models" / "tiny", other)
    assert main(["train", str(conf), "run.max_steps=3", f"model.path={other}"]) == 2
    assert "model.path: '" in capsys.readouterr().err
