"""Evaluation during training under torchrun (2 ranks, gloo): every rank evaluates half the prompts, the
results are averaged, and greedy accuracy equals one process evaluating all of them; only rank 0 prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _torchrun import finish, prompts, torchrun, write_config  # noqa: F401  (fixture)

import slimgrpo

pytestmark = pytest.mark.distributed

SRC = str(Path(slimgrpo.__file__).resolve().parents[1])
HERE = str(Path(__file__).resolve().parents[1])
HELDOUT = [{"prompt": f"Spell the word {w}.", "answer": w} for w in
           ("cat", "dog", "emu", "owl", "bee", "ant", "eel", "yak", "gnu")]  # 9: one prompt left out on 2 ranks


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_rank_eval_matches_one_process(tmp_path, tiny_model_dir, prompts, strategy):
    from slimgrpo.config import load_config
    from slimgrpo.train.trainer import Trainer

    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HELDOUT))
    out = tmp_path / "run"
    cfg_path = write_config(tmp_path / "cfg.yaml", tiny_model_dir, prompts, out, ["my_rewards.py:vowel_share"],
                            distributed={"strategy": strategy},
                            eval={"data": str(tmp_path / "heldout.jsonl"), "num_samples": 2, "threshold": 0.2})
    proc = torchrun(["-m", "slimgrpo", "train", str(cfg_path)], tmp_path, timeout=300,
                    env={"PYTHONPATH": f"{SRC}:{HERE}"})
    rc, text = finish(proc, 300)
    assert rc == 0, text[-4000:]
    records = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    before = next(r for r in records if r["step"] == 0)
    assert {"eval/accuracy_greedy", "eval/accuracy_sampled", "eval/pass@2"} <= set(before)
    assert text.count("slimgrpo train:") == 1 and text.count("done: 2 steps") == 1  # rank 0 only
    assert text.count("eval before training") == 1 and "8 held-out prompts" in text

    # One process, the first 8 prompts (what the two ranks shared), same model: the same greedy accuracy.
    cfg = load_config(str(cfg_path), [f"run.output_dir={tmp_path / 'single'}", "eval.max_prompts=8"])
    trainer = Trainer(cfg)
    single = trainer.evaluator.run()
    assert before["eval/accuracy_greedy"] == pytest.approx(single["eval/accuracy_greedy"])
