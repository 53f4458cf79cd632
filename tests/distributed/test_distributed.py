"""Multi-process training on CPU: torchrun with 2 ranks and the gloo backend.

* 2 ranks x half the prompts take the same step as 1 process x all prompts (DDP and FSDP2, several
  loss types, micro-batching on), on a fixed rollout so both see the same completions;
* greedy generation through FSDP2-sharded weights equals generation with the plain model (with
  `per_layer` also when the ranks would run different numbers of forwards: rows that end at different
  steps, prompts of different widths);
* a 2-rank run killed (SIGKILL) after a checkpoint resumes and ends with the weights of an
  uninterrupted run; the final model is one Hugging Face folder;
* a reward function raising on rank 1 only stops both ranks promptly, with its message;
  a collective that waits too long fails with a clear timeout.

Each test launches ``python -m torch.distributed.run --standalone`` (the rendezvous and the master port
are picked free by the OS, so tests can run side by side) with a hard timeout.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from _torchrun import (  # noqa: F401 - prompts is a fixture
    WORKER, _final_weights, _train_command, finish, kill_and_resume, prompts, run_two_ranks_and_one,
    same_step_cases, torchrun, write_config,
)

pytestmark = pytest.mark.distributed


CASES = {
    "ddp-dapo": {"distributed": {"strategy": "ddp"}, "loss": {"loss_type": "dapo"}},
    "ddp-grpo-batchstd": {"distributed": {"strategy": "ddp"},
                          "loss": {"loss_type": "grpo", "scale_rewards": "batch"}},
    "ddp-lora-dr_grpo": {"distributed": {"strategy": "ddp"}, "loss": {"loss_type": "dr_grpo"},
                         "lora": {"enabled": True, "r": 4}},
    "fsdp-dapo-kl-mu2": {"distributed": {"strategy": "fsdp"},
                         "loss": {"loss_type": "dapo", "beta": 0.04, "num_iterations": 2}},
    "fsdp-grpo": {"distributed": {"strategy": "fsdp"}, "loss": {"loss_type": "grpo"}},
    # a token budget packs each rank's rows into a different number of micro-batches: FSDP2 splits to agree
    "fsdp-tokens-dapo": {"distributed": {"strategy": "fsdp"}, "loss": {"loss_type": "dapo", "num_iterations": 2},
                         "memory": {"micro_batch_size": None, "micro_batch_tokens": 48}},
    "fsdp-lora-dapo-kl": {"distributed": {"strategy": "fsdp"}, "lora": {"enabled": True, "r": 4},
                          "loss": {"loss_type": "dapo", "beta": 0.04, "num_iterations": 2}},
    "ddp-gdpo-sequence": {"distributed": {"strategy": "ddp"},
                          "loss": {"multi_objective_aggregation": "normalize_then_sum", "loss_type": "grpo",
                                   "importance_sampling_level": "sequence", "num_iterations": 2}},
}


def test_two_ranks_take_the_same_step_as_one_process(tmp_path, tiny_model_dir, prompts):
    from safetensors.torch import load_file

    import distributed_worker

    out = tmp_path / "out"
    out.mkdir()
    cases, single = same_step_cases(tmp_path, tiny_model_dir, prompts, CASES)
    gen_configs = [str(write_config(tmp_path / f"gen-{mode}.yaml", tiny_model_dir, prompts, tmp_path / f"gen-{mode}",
                                    ["my_rewards.py:vowel_share"],
                                    distributed={"strategy": "fsdp", "fsdp_generation": mode}))
                   for mode in ("gather", "per_layer")]
    run_two_ranks_and_one(WORKER, {"cases": cases, "generation": gen_configs, "out": str(out)}, single,
                          distributed_worker.run_case, tmp_path, timeout=120)

    for name in CASES:
        one, two = load_file(str(out / f"{name}-1.safetensors")), load_file(str(out / f"{name}-2.safetensors"))
        grads = [k for k in one if k.startswith("grad.")]
        assert grads and sorted(k for k in two if k.startswith("grad.")) == sorted(grads), name
        for key in grads:  # the gradient of the last step (after clipping), gathered over ranks
            torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name} {key}: {m}")
        for key in (k for k in one if not k.startswith("grad.")):
            if key in two:  # a gathered state dict may hold a tied head once
                torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-5, msg=lambda m: f"{name} {key}: {m}")
        m1 = json.loads((out / f"{name}-1.json").read_text())
        m2 = json.loads((out / f"{name}-2.json").read_text())
        for a, b in zip(m1, m2):  # metrics reduced across ranks match the single process
            for k in ("loss", "grad_norm", "reward", "kl", "length_mod/mean_tokens"):  # log_metric: mean of calls
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (name, k, a, b)

    for i in range(2):
        for rank in range(2):
            g = json.loads((out / f"generation-{i}-rank{rank}.json").read_text())
            assert g["type"] == "ShardedGenerationEngine"
            assert g["sharded"] == g["plain"], (i, rank)
            if i == 1:  # per_layer: ranks whose rows end at different steps, prompts of different widths
                assert g["uneven_sharded"] == g["uneven_plain"], rank
                assert len(g["uneven_plain"][0]) == (1 if rank == 0 else 8)


# fsdp in the fast suite; the other strategies (40 s each on 2 cores) with -m slow
@pytest.mark.parametrize("strategy", ["fsdp", *(pytest.param(s, marks=pytest.mark.slow)
                                               for s in ("ddp-lora", "fsdp-lora", "fsdp-bf16"))])
def test_killed_run_resumes_to_the_same_weights(tmp_path, tiny_model_dir, prompts, strategy):
    """SIGKILL of torchrun and its ranks once a checkpoint exists; the same command resumes and ends where
    an uninterrupted run ends. Both use real sampling: each rank's generator is restored. FSDP2 shards
    full weights and AdamW state; DDP with LoRA saves only the trainable adapter; FSDP2 with LoRA shards
    the frozen base and the adapter and saves the adapter's shards; bf16 full fine-tuning under FSDP2 shards
    the float32 master weights (memory.bf16_update) and restores them at full precision."""
    lora = {"enabled": strategy.endswith("lora"), "r": 4}
    model = {"dtype": "bfloat16"} if strategy.endswith("bf16") else {}

    def config(name: str) -> Path:
        return write_config(tmp_path / f"{name}.yaml", tiny_model_dir, prompts, tmp_path / name,
                            ["my_rewards.py:vowel_share", "my_rewards.py:stalls_after_gate"],
                            distributed={"strategy": strategy.split("-")[0]}, loss={"beta": 0.04}, lora=lora,
                            run={"max_steps": 5, "save_steps": 1, "save_total_limit": 2},
                            rollout={"temperature": 1.0}, model=model)

    kill_and_resume(tmp_path, config("straight"), config("broken"), timeout=150, wait=120)

    a, b = _final_weights(tmp_path / "straight"), _final_weights(tmp_path / "broken")
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=lambda m: f"{k}: {m}")
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
    from transformers import AutoModelForCausalLM

    final = tmp_path / "broken" / "final"
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir if lora["enabled"] else final))
    if lora["enabled"]:  # ONE adapter folder
        from peft import PeftModel

        PeftModel.from_pretrained(model, str(final))


def test_reward_error_on_one_rank_stops_every_rank_promptly(tmp_path, tiny_model_dir, prompts):
    cfg = write_config(tmp_path / "cfg.yaml", tiny_model_dir, prompts, tmp_path / "run",
                       ["my_rewards.py:vowel_share", "my_rewards.py:fails_on_rank_1"],
                       distributed={"strategy": "ddp"})
    start = time.monotonic()
    code, log = finish(torchrun(_train_command(cfg), tmp_path, timeout=90), timeout=90)
    elapsed = time.monotonic() - start
    assert code != 0
    assert "reward exploded on rank 1" in log  # rank 1's own error
    assert "rank 1 failed during decoding and scoring rewards" in log  # what rank 0 says
    assert elapsed < 60, f"took {elapsed:.0f}s to stop"


TIMEOUT_SCRIPT = """
import os, time
from slimgrpo.config import load_config
from slimgrpo.distributed.context import from_environment
from slimgrpo.distributed.process_group import init_process_group

ctx = from_environment()
init_process_group(load_config(None, ["distributed.timeout_s=3"], validate=False), ctx)
if ctx.rank == 1:
    time.sleep(60)  # stuck: never joins the collective
ctx.barrier()
"""


def test_collective_that_waits_too_long_fails_with_a_clear_timeout(tmp_path):
    script = tmp_path / "stuck.py"
    script.write_text(TIMEOUT_SCRIPT)
    start = time.monotonic()
    code, log = finish(torchrun([str(script)], tmp_path, timeout=60), timeout=60)
    elapsed = time.monotonic() - start
    assert code != 0
    assert "waited longer than distributed.timeout_s=3" in log, log[-4000:]
    assert elapsed < 45, f"took {elapsed:.0f}s"


def test_run_folder_lock_and_finished_run_under_torchrun(tmp_path, tiny_model_dir, prompts):
    """Rank 0 holds the run folder's lock; a folder held by another process stops every rank at once
    (exit 2, naming the holder, no rank left waiting); a finished run started again says so on every rank."""
    from slimgrpo.checkpoint.run_lock import RunLock

    cfg = write_config(tmp_path / "cfg.yaml", tiny_model_dir, prompts, tmp_path / "run",
                       ["my_rewards.py:vowel_share"], distributed={"strategy": "ddp"}, run={"max_steps": 1})
    code, log = finish(torchrun(_train_command(cfg), tmp_path, timeout=150), timeout=150)
    assert code == 0, log[-6000:]
    code, log = finish(torchrun(_train_command(cfg), tmp_path, timeout=150), timeout=150)
    assert code == 0 and "already finished at step 1; nothing to do" in log, log[-6000:]
    with RunLock(tmp_path / "run"):
        start = time.monotonic()
        code, log = finish(torchrun(_train_command(cfg, "run.max_steps=2"), tmp_path, timeout=150), timeout=150)
    assert code != 0 and f"is in use by pid {os.getpid()}" in log, log[-6000:]
    assert time.monotonic() - start < 120
    assert [json.loads(ln)["step"] for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()] == [1]
