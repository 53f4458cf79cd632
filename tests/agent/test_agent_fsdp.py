"""Tool-calling rollouts under FSDP2 (2 ranks, gloo on CPU): the multi-turn decoder runs on gathered
weights (``distributed.fsdp_generation=gather``; ``per_layer`` is refused), and 2 ranks with half the prompts each
train to the same loss, metrics and weights as one process with all of them.

Both runs decode greedily (``rollout.temperature=0``), so a row's completion depends only on its prompt and
the weights, not on a rank's sampling generator. The rows of a group still differ: the environment's
``reset`` adds a different observation to each of a prompt's G rows (counted per prompt, so the same on
any number of ranks), which gives the group advantages something to work with. The environment, config and
comparison are shared with the DDP test (``_agent_dist_helpers.py``)."""

from __future__ import annotations

import pytest

from _agent_dist_helpers import assert_matches_one_process, train_one_process, write_agent_config
from slimgrpo.commands.demo_tools import TOOLS_DIR
from _torchrun import finish, torchrun

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not (TOOLS_DIR / "model" / "model.safetensors").exists(),
                                 reason="tool demo assets not built")]


def test_tool_rollouts_under_fsdp_match_one_process(tmp_path):
    two = write_agent_config(tmp_path, "two", "fsdp", "gather")
    layers = write_agent_config(tmp_path, "layers", "fsdp", "per_layer")
    one = write_agent_config(tmp_path, "one", "fsdp", "gather")
    proc = torchrun(["-m", "slimgrpo", "train", str(two)], tmp_path, timeout=240)
    single = train_one_process(one, tmp_path)
    code, log = finish(proc, timeout=240)
    assert code == 0, log[-6000:]
    assert single.returncode == 0, (single.stdout + single.stderr)[-6000:]
    assert "2 processes (fsdp)" in log
    # fsdp_generation=per_layer would pair each rank's per-layer all-gathers of different numbers of decode
    # steps: refused on every rank, nobody left waiting
    code, log = finish(torchrun(["-m", "slimgrpo", "train", str(layers)], tmp_path, timeout=120), timeout=120)
    assert code != 0 and log.count("need distributed.fsdp_generation=gather") >= 2, log[-6000:]

    assert_matches_one_process(tmp_path / "one", tmp_path / "two")
