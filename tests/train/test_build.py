"""A run built whole (train/build.py): ``build_run`` returns every part, ``Trainer`` is complete from
``__init__``, a failed build leaves the folder unlocked, a finished run is built without writing."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from slimgrpo.checkpoint.run_lock import LOCK_NAME
from slimgrpo.config import load_config
from slimgrpo.distributed.context import from_environment
from slimgrpo.train.build import RunInputs, RunParts, StopRequest, build_run
from slimgrpo.train.trainer import Trainer

TRAINER = Path(__file__).resolve().parents[2] / "src" / "slimgrpo" / "train" / "trainer.py"
ROWS = [{"prompt": f"What is {a} plus {a}?", "answer": str(2 * a)} for a in range(8)]


def _config(tmp_path, model_dir, *extra):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return load_config(None, [f"model.path={model_dir}", f"data.path={data}", "rollout.num_generations=4", "run.batch_size=8",
                              "rollout.max_completion_length=4", "data.max_prompt_length=48", "run.max_steps=1",
                              f"run.output_dir={tmp_path / 'run'}", "log.progress=false", "run.save_model=false",
                              "rewards.functions=[length]", *extra], validate=False)


def test_every_attribute_of_the_trainer_is_set_in_init():
    """Methods other than ``__init__`` only assign attributes that ``__init__`` declared."""
    cls = next(n for n in ast.parse(TRAINER.read_text()).body if isinstance(n, ast.ClassDef) and n.name == "Trainer")

    def assigned(fn) -> set[str]:
        return {t.attr for node in ast.walk(fn) if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}

    methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    declared = assigned(next(m for m in methods if m.name == "__init__"))
    later = set().union(*(assigned(m) for m in methods if m.name != "__init__"))
    assert later <= declared, f"set outside __init__: {sorted(later - declared)}"


def test_built_parts_make_a_complete_trainer(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir)
    stop = StopRequest()
    parts = build_run(cfg, RunInputs(from_environment(), stop=stop))
    assert isinstance(parts, RunParts) and parts.start_step == 0 and parts.stop is stop
    with pytest.raises(dataclasses.FrozenInstanceError):
        parts.engine = None
    with pytest.raises(TypeError, match="RunInputs"):  # the inputs belong to the build
        Trainer(parts, tools=[len])
    trainer = Trainer(parts)
    assert trainer.policy is parts.policy and trainer.evaluator is None and trainer.agent is None
    assert trainer.train()["steps"] == 1
    assert trainer.run_lock is None  # released when train() returned


def test_a_failed_build_leaves_the_folder_unlocked(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, "eval.data=missing.jsonl")
    with pytest.raises(Exception, match="missing.jsonl"):
        Trainer(cfg)
    # the same folder can be locked again at once: the failed build released it
    trainer = Trainer(_config(tmp_path, tiny_model_dir))
    assert trainer.run_lock is not None
    trainer.checkpoints.release()


def test_a_finished_run_is_built_without_writing(tmp_path, tiny_model_dir):
    Trainer(_config(tmp_path, tiny_model_dir)).train()
    run = tmp_path / "run"
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    trainer = Trainer(_config(tmp_path, tiny_model_dir))
    assert not trainer.writer.enabled and trainer.evaluator is None
    summary = trainer.train()
    assert summary["already_finished"] is True
    after = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != LOCK_NAME}
    assert after == before
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
