"""Bad input under torchrun (2 CPU ranks, gloo): a batch the ranks cannot share evenly, ranks that
disagree on the config and a model FSDP2 cannot shard are refused on every rank before any weight is
loaded (before the memory plan), with one message and exit 2; every rank exits (nothing is killed by the
test)."""

from __future__ import annotations

import re
import time

import pytest

from _torchrun import finish, prompts, torchrun, write_config  # noqa: F401 - prompts is a fixture

pytestmark = pytest.mark.distributed

PER_RANK_CONFIG = """
import os, sys
from slimgrpo.commands.cli import main
sys.exit(main(["train", f"cfg-rank{os.environ['RANK']}.yaml"]))
"""


def _refused_on_every_rank(log: str, message: str) -> None:
    """Every rank raises the same error right after the same collective; the first to exit does so with 2
    and torchrun then stops the others with SIGTERM (-15) if they have not exited yet (on this machine
    both usually exit 2 first)."""
    assert message in log, log[-6000:]
    codes = re.findall(r"exitcode\s*:\s*(-?\d+)", log)
    assert "2" in codes and set(codes) <= {"2", "-15"}, log[-6000:]
    assert "memory plan" not in log.lower(), log[-6000:]  # printed before the weights load: never reached


def test_a_batch_the_ranks_cannot_share_is_refused_on_every_rank(tmp_path, tiny_model_dir, prompts):  # noqa: F811
    cfg = write_config(tmp_path / "cfg.yaml", tiny_model_dir, prompts, tmp_path / "run",
                       ["my_rewards.py:vowel_share"], run={"batch_size": 12})  # 3 prompts per step, 2 ranks
    start = time.monotonic()
    code, log = finish(torchrun(["-m", "slimgrpo", "train", str(cfg)], tmp_path, timeout=90), timeout=90)
    assert code != 0
    _refused_on_every_rank(log, "which 2 processes cannot share evenly: use a multiple of 8 for run.batch_size")
    assert time.monotonic() - start < 60


def test_ranks_that_disagree_on_the_config_are_refused_on_every_rank(tmp_path, tiny_model_dir, prompts):  # noqa: F811
    for rank, temperature in ((0, 1.0), (1, 0.7)):
        write_config(tmp_path / f"cfg-rank{rank}.yaml", tiny_model_dir, prompts, tmp_path / "run",
                     ["my_rewards.py:vowel_share"], rollout={"temperature": temperature})
    (tmp_path / "per_rank.py").write_text(PER_RANK_CONFIG)
    code, log = finish(torchrun([str(tmp_path / "per_rank.py")], tmp_path, timeout=90), timeout=90)
    assert code != 0
    _refused_on_every_rank(log, "disagree on the config: rank 1 has rollout.temperature=0.7 where rank 0 has 1.0")
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


UNSHARDABLE = """
import sys
from transformers import Qwen2ForCausalLM, Qwen2Model
from slimgrpo.commands.cli import main

# A causal LM FSDP2 cannot split: no _no_split_modules and no decoder.layers
Qwen2ForCausalLM._no_split_modules = None
Qwen2Model._no_split_modules = None
Qwen2ForCausalLM.get_decoder = lambda self: object()
sys.exit(main(["train", "cfg.yaml"]))
"""


def test_a_model_fsdp_cannot_shard_is_refused_before_any_weight_is_read(tmp_path, tiny_model_dir, prompts):  # noqa: F811
    import shutil

    model = tmp_path / "model"  # the config and tokenizer only: a weight read would fail with another error
    shutil.copytree(tiny_model_dir, model, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    write_config(tmp_path / "cfg.yaml", model, prompts, tmp_path / "run", ["my_rewards.py:vowel_share"],
                 distributed={"strategy": "fsdp"})
    (tmp_path / "unshardable.py").write_text(UNSHARDABLE)
    code, log = finish(torchrun([str(tmp_path / "unshardable.py")], tmp_path, timeout=90), timeout=90)
    assert code != 0
    _refused_on_every_rank(log, "distributed.strategy=fsdp: cannot find the decoder layers of Qwen2ForCausalLM")
    assert "use distributed.strategy=ddp" in log
