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
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml

from conftest import write_jsonl

pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parents[1]
WORKER = HERE / "distributed_worker.py"

# The reward of the killed-run tests (``kill_and_resume``; ``_agent_dist_helpers.ENV`` has it too): it holds
# the run still once the file named by STALL_WHEN_EXISTS exists, so that the kill lands mid-step.
STALL_REWARD = """
def stalls_after_gate(prompts, completions, completion_ids=None, **kwargs):
    gate = os.environ.get("STALL_WHEN_EXISTS")
    if gate and os.path.exists(gate):  # hold the run still until the test kills it
        time.sleep(600)
    return [float(len(ids) % 3) for ids in completion_ids]
"""

REWARDS = """
import os, time

def vowel_share(prompts, completions, completion_ids=None, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(len(c), 1) for c in completions]

def length_mod(prompts, completions, completion_ids=None, log_metric=None, **kwargs):
    log_metric("length_mod/mean_tokens", sum(len(ids) for ids in completion_ids) / len(completion_ids))
    return [float(len(ids) % 3) for ids in completion_ids]

def fails_on_rank_1(prompts, completions, completion_ids=None, **kwargs):
    if os.environ.get("RANK") == "1":
        raise ValueError("reward exploded on rank 1 (test)")
    return [0.0 for _ in completions]
""" + STALL_REWARD


def torchrun(args: list[str], tmp_path: Path, timeout: float, nproc: int = 2, env: dict | None = None,
             **popen) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "--monitor-interval=0.2", *args]
    # This checkout's src first: an installed slimgrpo (e.g. another checkout, editable) must not answer.
    path = os.pathsep.join([str(HERE), str(HERE.parent / "src")])
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, **(env or {})}
    return subprocess.Popen(cmd, cwd=tmp_path, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True, **popen)


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its ranks at once, like a power cut. torchrun starts every rank in a session
    of its own, so killing torchrun's process group alone would leave the ranks running."""
    ranks = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            if f"PPid:\t{proc.pid}\n" in status.read_text():
                ranks.append(int(status.parent.name))
        except OSError:
            continue
    for pid in [proc.pid, *ranks]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"torchrun did not finish within {timeout}s:\n{out[-4000:]}") from None
    return proc.returncode, out


def write_config(path: Path, model_dir: Path, prompts: Path, out: Path, rewards: list[str], **sections) -> Path:
    (path.parent / "my_rewards.py").write_text(REWARDS)
    data = {
        "model": {"path": str(model_dir)},
        "data": {"path": str(prompts), "max_prompt_length": 32},
        "rollout": {"num_generations": 4, "max_completion_length": 8},
        "rewards": {"functions": rewards},
        "loss": {},
        "memory": {"micro_batch_size": 3},
        "optim": {"learning_rate": 1e-3, "max_grad_norm": 0.5},
        "run": {"max_steps": 2, "batch_size": 16, "output_dir": str(out), "seed": 3, "num_threads": 1},
        "log": {"progress": False, "log_completions_steps": 0},
    }
    for section, values in sections.items():
        data.setdefault(section, {}).update(values)
    path.write_text(yaml.safe_dump(data))
    return path


def same_step_cases(tmp_path: Path, model_dir: Path, prompts: Path, sections_of: dict[str, dict],
                    ) -> tuple[list[dict], list[dict]]:
    """Worker cases (2 steps each) for the same-step tests: for each name -> config sections, one for the
    2 ranks and one for the single process that is their reference (same config, its own run folder)."""
    two, one = [], []
    rewards = ["my_rewards.py:vowel_share", "my_rewards.py:length_mod"]
    for name, sections in sections_of.items():
        for n, group in ((2, two), (1, one)):
            config = write_config(tmp_path / f"{name}-{n}.yaml", model_dir, prompts, tmp_path / f"run-{name}-{n}",
                                  rewards, **sections)
            group.append({"name": f"{name}-{n}", "config": str(config), "steps": 2})
    return two, one


def run_two_ranks_and_one(worker: Path, job: dict, single: list[dict], run_case: Callable, tmp_path: Path,
                          timeout: float) -> None:
    """``job`` on 2 ranks of ``worker`` under torchrun while ``run_case`` runs the ``single`` cases in this
    process (the reference: one process, every prompt); the ranks must finish cleanly."""
    from slimgrpo.distributed.context import DistContext

    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    proc = torchrun([str(worker), str(path)], tmp_path, timeout=timeout)
    for case in single:  # the reference runs while the 2 ranks run
        run_case(case, Path(job["out"]), DistContext())
    code, log = finish(proc, timeout=timeout)
    assert code == 0, log[-6000:]


@pytest.fixture
def prompts(tmp_path) -> Path:
    rows = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(1, 5) for b in range(1, 5)]
    return write_jsonl(tmp_path / "prompts.jsonl", rows)


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


def _train_command(config: Path, *overrides: str) -> list[str]:
    return ["-m", "slimgrpo", "train", str(config), *overrides]


def _final_weights(run: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    files = sorted((run / "final").glob("*.safetensors"))
    assert files, f"no final model in {run}"
    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def kill_and_resume(tmp_path: Path, straight: Path, broken: Path, timeout: float, wait: float) -> None:
    """Run ``straight`` uninterrupted beside ``broken``; SIGKILL torchrun and the ranks of ``broken`` once its
    checkpoint 2 is complete (a reward stalls step 3 from then on, so the kill lands mid-run every time), run
    the same command again, which must resume; both end with exit 0."""
    reference = torchrun(_train_command(straight), tmp_path, timeout=timeout)
    marker = tmp_path / "broken" / "checkpoints" / "checkpoint-2" / "COMPLETE"
    victim = torchrun(_train_command(broken), tmp_path, timeout=timeout, env={"STALL_WHEN_EXISTS": str(marker)})
    deadline = time.monotonic() + wait
    while not marker.exists() and victim.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    kill_job(victim)  # torchrun and both ranks, no cleanup
    _, victim_log = finish(victim, timeout=30)
    assert marker.exists(), victim_log[-4000:]
    assert not (tmp_path / "broken" / "final").exists(), "the run finished before the kill"

    code, log = finish(torchrun(_train_command(broken), tmp_path, timeout=timeout), timeout=timeout)
    assert code == 0, log[-6000:]
    assert "resumed from" in log
    code, ref_log = finish(reference, timeout=timeout)
    assert code == 0, ref_log[-6000:]


@pytest.mark.parametrize("strategy", ["fsdp", "ddp-lora", "fsdp-lora", "fsdp-bf16"])
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
