"""Same seed, same run.

The cause found: gathers with repeated indices in the update (every completion of a group starts from its
prompt's last hidden state; the shared-prompt layout fans each group's keys and values out to its rows).
Written as ``x[index]`` their backward is an accumulating ``index_put_``, which on CPU with more than one
thread adds the repeated rows with parallel atomic float adds in whatever order the threads reach them:
the gradient differed in its last bits from process to process, and a GRPO run on SmolLM2 parted ways
after a few steps. ``loss.gather.take_rows`` sums in a fixed order.

Checked here: the gather against advanced indexing (values and gradients), its backward bit-identical
over many calls with two threads at a size where the atomic path runs, the cache fan-out against
transformers' own, and whole trainings in fresh processes with different ``PYTHONHASHSEED`` (two threads,
shapes past the atomic path's size), uninterrupted and killed-then-resumed, giving identical metrics and
weights.
"""

from __future__ import annotations

import hashlib

import pytest
import torch
from safetensors.torch import load_file

from run_helpers import cli, numeric_metrics, write_run
from slimgrpo.forward.gather import select_cache_rows, take_rows


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().numpy().tobytes()).hexdigest()


def _repeated_index() -> torch.Tensor:
    index = torch.arange(100, 596).view(8, -1).clone()
    index[:, 0] = 5  # one row repeated at the start of every segment: the threads meet on it
    return index.flatten()


def test_take_rows_equals_advanced_indexing():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 11, 5, generator=g, dtype=torch.float64, requires_grad=True)
    for dim, index in ((0, torch.tensor([3, 3, 0, 36, 3, 7, 7])), (1, torch.tensor([10, 0, 0, 4]))):
        ours = take_rows(x, index, dim)
        ref = x[index] if dim == 0 else x[:, index]
        assert torch.equal(ours, ref)
        w = torch.randn(ref.shape, generator=g, dtype=torch.float64)
        (g_ours,) = torch.autograd.grad((ours * w).sum(), x)
        (g_ref,) = torch.autograd.grad((ref * w).sum(), x)
        torch.testing.assert_close(g_ours, g_ref, rtol=0, atol=1e-12)


def test_take_rows_backward_is_the_same_every_call_with_two_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(700, 128, generator=g, requires_grad=True)  # 496 x 128 gathered: past torch's grain
        index = _repeated_index()
        grad_out = torch.randn(index.numel(), 128, generator=g)
        seen = set()
        for _ in range(100):
            (grad,) = torch.autograd.grad(take_rows(x, index), x, grad_out)
            seen.add(_digest(grad))
        assert len(seen) == 1
        # and it is the in-order sum (a loop over the indices, one row at a time)
        expected = torch.zeros_like(x)
        for i, row in enumerate(index.tolist()):
            expected[row] += grad_out[i]
        assert torch.equal(grad, expected)
    finally:
        torch.set_num_threads(previous)


def test_select_cache_rows_equals_transformers_batch_select():
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(1)
    index = torch.tensor([0, 0, 0, 1, 1, 2])
    ours, theirs = DynamicCache(), DynamicCache()
    for layer in range(3):
        k, v = torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g)
        ours.update(k, v, layer)
        theirs.update(k.clone(), v.clone(), layer)
    select_cache_rows(ours, index)
    theirs.batch_select_indices(index)
    for a, b in zip(ours.layers, theirs.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.fixture(scope="module")
def wide_model_dir(tmp_path_factory):
    """A tiny Qwen2 wide enough (hidden 256) that the update's gathers pass torch's parallel grain."""
    from conftest import build_tiny_model, build_tokenizer

    folder = tmp_path_factory.mktemp("wide_model")
    tok = build_tokenizer(folder)
    build_tiny_model(folder, vocab_size=len(tok), hidden=256, seed=3)
    return folder


# Two threads (the racy case); 3 groups of 8 rows, so one group's rows are split between the threads; up
# to 24 completion tokens after prompts padded to 64, so the shared-prompt layout's key/value fan-out
# (24 x 2 x 64 x 64 values a layer) passes torch's parallel grain. Without the fix this test fails about
# every other run (the race is timing); test_take_rows_backward_... fails every time.
PROMPTS = [{"prompt": f"Please add the two numbers {a} and {b} together, and then reply with only the sum of them."}
           for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 1)]]
SECTIONS = dict(data={"path": "prompts.jsonl", "max_prompt_length": 64},
                run={"max_steps": 4, "save_steps": 2, "batch_size": 24, "num_threads": 2, "seed": 11},
                rollout={"num_generations": 8, "max_completion_length": 24},
                optim={"learning_rate": 3e-3, "lr_scheduler_type": "linear"},
                log={"log_completions_steps": 1, "num_completions_to_log": 3})


def _weights(run) -> dict[str, torch.Tensor]:
    return load_file(str(next((run / "final").glob("*.safetensors"))))


def test_two_processes_with_different_hash_seeds_train_identically(tmp_path, wide_model_dir):
    runs = []
    for seed in ("1", "2"):
        cfg = write_run(tmp_path / f"h{seed}", wide_model_dir, prompts=PROMPTS, **SECTIONS)
        out = cli("train", str(cfg), env={"PYTHONHASHSEED": seed, "OMP_NUM_THREADS": "2"})
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(tmp_path / f"h{seed}" / "run")
    first, second = (numeric_metrics(r) for r in runs)
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    assert first == second
    a, b = (_weights(r) for r in runs)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    # Killed in the middle of step 3 (its reward call) and resumed in a new process with another hash
    # seed: the same weights and numbers as the uninterrupted runs.
    cfg = write_run(tmp_path / "killed", wide_model_dir, prompts=PROMPTS, **SECTIONS)
    out = cli("train", str(cfg), env={"PYTHONHASHSEED": "3", "OMP_NUM_THREADS": "2", "TEST_SIGNAL_AT_CALL": "KILL:3"})
    assert out.returncode != 0
    out = cli("train", str(cfg), env={"PYTHONHASHSEED": "4", "OMP_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert "resumed from" in out.stderr
    resumed = tmp_path / "killed" / "run"
    assert numeric_metrics(resumed) == first
    c = _weights(resumed)
    assert all(torch.equal(a[k], c[k]) for k in a)


def test_full_determinism_runs_and_repeats(tmp_path, tiny_model_dir):
    """TRL's switch: torch's deterministic algorithms on (process-wide, so in a child process); every op
    of a step (rollout, shared-prompt update, KL to the reference) has a deterministic CPU kernel."""
    runs = []
    for name in ("a", "b"):
        cfg = write_run(tmp_path / name, tiny_model_dir, run={"full_determinism": True, "num_threads": 2})
        out = cli("train", str(cfg), env={"PYTHONHASHSEED": name == "a" and "5" or "6"})
        assert out.returncode == 0, out.stderr[-3000:]
        runs.append(tmp_path / name / "run")
    assert numeric_metrics(runs[0]) == numeric_metrics(runs[1])


@pytest.mark.parametrize("value, message", [("-1", "run.seed must be an integer from 0"),
                                            ("1.5", "run.seed: expected an integer")])
def test_bad_seed_is_refused_naming_the_key(tmp_path, tiny_model_dir, value, message):
    cfg = write_run(tmp_path, tiny_model_dir)
    out = cli("train", str(cfg), f"run.seed={value}")
    assert out.returncode == 2
    assert message in out.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written
