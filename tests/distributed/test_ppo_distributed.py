"""PPO under torchrun (2 ranks, gloo, CPU): the same step as one process, and a killed run that resumes.

* 2 ranks x half the prompts take the same PPO steps as 1 process x all prompts, for the LoRA critic
  (a second adapter on the policy's base) under DDP and the full-fine-tuning critic (a value model of its
  own) under DDP and FSDP2: the gradients of the policy and of the critic, the updated weights of both and
  the logged metrics (value loss, explained variance, KL penalty: whitening and the value statistics
  take every rank's tokens), within float tolerance;
* a 2-rank PPO run (LoRA under DDP, full fine-tuning under FSDP2) killed (SIGKILL) after a checkpoint
  resumes (critic and its optimizer state from the distributed checkpoint) and ends with the weights of
  an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _torchrun import (  # noqa: F401
    _final_weights, kill_and_resume, prompts, run_two_ranks_and_one, same_step_cases, write_config,
)

pytestmark = pytest.mark.distributed

HERE = Path(__file__).resolve().parents[1]
WORKER = HERE / "ppo_distributed_worker.py"

PPO = {"advantage_estimator": "gae", "loss_type": "dapo", "kl_coef": 0.05, "beta": 0.04, "num_iterations": 2,
       "whiten_rewards": True}
CASES = {
    "ddp-lora": {"distributed": {"strategy": "ddp"}, "lora": {"enabled": True, "r": 4}, "loss": PPO},
    "ddp-full": {"distributed": {"strategy": "ddp"}, "loss": PPO},
    "fsdp-full": {"distributed": {"strategy": "fsdp"}, "loss": {**PPO, "whiten_rewards": False}},
    "fsdp-lora": {"distributed": {"strategy": "fsdp"}, "lora": {"enabled": True, "r": 4}, "loss": PPO},
}


def test_two_ranks_take_the_same_ppo_step_as_one_process(tmp_path, tiny_model_dir, prompts):  # noqa: F811
    from safetensors.torch import load_file

    import ppo_distributed_worker

    out = tmp_path / "out"
    out.mkdir()
    cases, single = same_step_cases(tmp_path, tiny_model_dir, prompts, CASES)
    run_two_ranks_and_one(WORKER, {"cases": cases, "out": str(out)}, single, ppo_distributed_worker.run_case,
                          tmp_path, timeout=240)

    for name in CASES:
        one, two = load_file(str(out / f"{name}-1.safetensors")), load_file(str(out / f"{name}-2.safetensors"))
        grads = sorted(k for k in one if k.startswith(("grad.", "critic_grad.")))
        assert any(k.startswith("critic_grad.head.") for k in grads), name  # the critic trained
        assert any(k.startswith("grad.") for k in grads), name
        assert sorted(k for k in two if k.startswith(("grad.", "critic_grad."))) == grads, name
        for key in grads:  # the gradient of the last optimizer step (after clipping), gathered over ranks
            assert one[key].abs().sum() > 0 or two[key].abs().sum() == 0, (name, key)
            torch.testing.assert_close(two[key], one[key], rtol=1e-4, atol=1e-6, msg=lambda m: f"{name} {key}: {m}")
        weights = [k for k in one if not k.startswith(("grad.", "critic_grad."))]
        assert any(k.startswith("critic.") for k in weights), name
        for key in weights:
            if key in two:  # a gathered state dict may hold a tied head once
                torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-5, msg=lambda m: f"{name} {key}: {m}")
        assert one["critic.head.weight"].abs().sum() > 0, name  # the value head moved from its zero init
        m1 = json.loads((out / f"{name}-1.json").read_text())
        m2 = json.loads((out / f"{name}-2.json").read_text())
        for a, b in zip(m1, m2):  # metrics reduced across ranks match the single process
            for k, v in a.items():
                assert v is not None, (name, k)
                assert b[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (name, k, a, b)


# ddp-lora in the fast suite; the FSDP2 cases (45 s each on 2 cores) with -m slow
@pytest.mark.parametrize("case", ["ddp-lora", *(pytest.param(c, marks=pytest.mark.slow) for c in ("fsdp-full", "fsdp-lora"))])
def test_killed_ppo_run_resumes_to_the_same_weights(tmp_path, tiny_model_dir, prompts, case):  # noqa: F811
    """SIGKILL of torchrun and its ranks once checkpoint 2 exists; the same command resumes (policy and
    critic: LoRA adapters under DDP, sharded full weights under FSDP2, the value head and every optimizer
    moment, from the distributed checkpoint) and ends where an uninterrupted run ends."""

    def config(name: str) -> Path:
        return write_config(tmp_path / f"{name}.yaml", tiny_model_dir, prompts, tmp_path / name,
                            ["my_rewards.py:vowel_share", "my_rewards.py:stalls_after_gate"],
                            distributed={"strategy": case.split("-")[0]}, loss=PPO,
                            lora={"enabled": case.endswith("lora"), "r": 4},
                            optim={"learning_rate": 1e-2}, rollout={"temperature": 1.0},
                            run={"max_steps": 4, "save_steps": 1, "save_total_limit": 2})

    kill_and_resume(tmp_path, config("straight"), config("broken"), timeout=200, wait=150)

    a, b = _final_weights(tmp_path / "straight"), _final_weights(tmp_path / "broken")
    assert sorted(a) == sorted(b)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=lambda m: f"{k}: {m}")
    rows = [json.loads(ln) for ln in (tmp_path / "broken" / "metrics.jsonl").read_text().splitlines()]
    ref_rows = [json.loads(ln) for ln in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r, s in zip(rows, ref_rows):  # the critic resumed too: its loss and values follow the same path
        for key in ("value/loss", "value/mean", "reward"):
            assert r[key] == pytest.approx(s[key], rel=1e-5, abs=1e-7), (r["step"], key)
