"""Weight precision and the optimizer: bfloat16 full fine-tuning keeps updates far
below a bfloat16 step (float32 master weights, torchao's stochastic rounding), 8-bit AdamW under FSDP2 is
torchao's (bitsandbytes' does not take DTensors), float16 full fine-tuning is refused, and the planner counts
what the master copy costs."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch

from slimgrpo.config import Config, ConfigError, from_dict, merge_overrides, validate_config
from slimgrpo.config.sections.memory import bf16_update_rule
from slimgrpo.update.optim import (MasterWeightAdamW, OptimizerUnavailable, apply_config_after_resume,
                                  build_optimizer, build_scheduler, lr_lambda)

from benchmarks.update import bf16_update

HAS_TORCHAO = importlib.util.find_spec("torchao") is not None


def _cfg(**memory) -> Config:
    cfg = Config()
    for key, value in memory.items():
        setattr(cfg.memory, key, value)
    return cfg


def _valid(**sections) -> dict:
    base = {"model": {"path": "m"}, "data": {"path": "d.jsonl"}, "rewards": {"functions": ["gsm8k_accuracy"]}}
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return base


# ------------------------------------------------------------------------------------- bf16 updates


def test_bf16_update_rule_auto_follows_the_optimizer():
    assert bf16_update_rule("auto", "adamw") == "fp32_master"
    assert bf16_update_rule("auto", "adamw_8bit") == "stochastic_round"
    assert bf16_update_rule("plain", "adamw") == "plain"


def test_bf16_full_finetuning_defaults_to_fp32_master_weights():
    bf16 = [torch.nn.Parameter(torch.zeros(4, 4, dtype=torch.bfloat16))]
    opt = build_optimizer(bf16, _cfg(), torch.device("cpu"))
    assert isinstance(opt, MasterWeightAdamW)
    fp32 = [torch.nn.Parameter(torch.zeros(4, 4))]  # LoRA adapters, float32 weights: torch's AdamW as before
    assert type(build_optimizer(fp32, _cfg(), torch.device("cpu"))) is torch.optim.AdamW
    plain = build_optimizer(bf16, _cfg(bf16_update="plain"), torch.device("cpu"))
    assert type(plain) is torch.optim.AdamW


def _small_model() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"proj": torch.randn(192, 160, generator=gen) * 0.02, "norm": torch.ones(160)}


def test_bf16_update_core_master_weights_follow_fp32_at_grpo_learning_rates():
    """benchmarks/update/bf16_update.py's core: at lr 1e-6 a plain bf16 step moves ~2% of N(0, 0.02) elements and
    keeps almost nothing of the float32 update; the master copy is the float32 run to float32 rounding."""
    start = _small_model()
    grads = bf16_update.gradients({n: t.shape for n, t in start.items()}, steps=10)
    rows = {r["variant"]: r for r in bf16_update.measure(start, grads, lrs=(1e-6,), rules=("plain", "fp32_master"))}
    assert rows["fp32"]["changed"] > 0.99 and rows["fp32"]["rel_dist"] == 0.0
    plain, master = rows["bf16 plain"], rows["bf16 fp32_master"]
    assert plain["changed"] < 0.10 and plain["rel_dist"] > 0.9
    assert master["master_rel_dist"] < 1e-3 and master["master_cos"] > 0.9999
    assert master["changed"] > plain["changed"]  # the weights the forward sees move as the master crosses steps
    assert "fp32" in bf16_update.table(list(rows.values()))


def test_master_weights_step_matches_torch_adamw_in_float32():
    torch.manual_seed(0)
    w = (torch.randn(64, 48) * 0.02).bfloat16()
    ref = torch.nn.Parameter(w.float())
    p = torch.nn.Parameter(w.clone())
    o_ref = torch.optim.AdamW([ref], lr=1e-6, betas=(0.9, 0.99), weight_decay=0.01)
    o = MasterWeightAdamW([p], lr=1e-6, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.01)
    for _ in range(5):
        g = torch.randn(64, 48).bfloat16()
        ref.grad, p.grad = g.float(), g
        o_ref.step()
        o.step()
    master = o.state[p]["master"]
    assert master.dtype == torch.float32 and o.state[p]["exp_avg"].dtype == torch.float32
    torch.testing.assert_close(master, ref.detach(), rtol=0, atol=1e-9)
    assert torch.equal(p.detach(), master.bfloat16())  # the weight is the master rounded to nearest


def test_master_weights_survive_a_checkpoint_round_trip(tmp_path):
    from slimgrpo.checkpoint.format import load_nested, save_nested

    torch.manual_seed(0)
    p = torch.nn.Parameter((torch.randn(32, 16) * 0.02).bfloat16())
    q = torch.nn.Parameter(p.detach().clone())
    o1 = MasterWeightAdamW([p], lr=1e-6, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    o2 = MasterWeightAdamW([q], lr=1e-6, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0)
    p.grad = torch.randn_like(p)
    o1.step()
    skel = save_nested(o1.state_dict(), tmp_path / "opt.safetensors")
    o2.load_state_dict(load_nested(skel, tmp_path / "opt.safetensors"))
    # torch's load_state_dict alone would cast the float32 master to the bf16 parameter's dtype
    assert o2.state[q]["master"].dtype == torch.float32
    assert torch.equal(o2.state[q]["master"], o1.state[p]["master"])
    q.data.copy_(p.detach())
    g = torch.randn_like(p)
    p.grad, q.grad = g.clone(), g.clone()
    o1.step()
    o2.step()
    assert torch.equal(o1.state[p]["master"], o2.state[q]["master"]) and torch.equal(p, q)


def test_master_weights_resume_a_plain_adamw_state():
    """A checkpoint saved by plain AdamW (bf16 moments, no master) resumes: the master starts at the weight."""
    p = torch.nn.Parameter((torch.randn(8, 8) * 0.02).bfloat16())
    plain = torch.optim.AdamW([p], lr=1e-6)
    p.grad = torch.randn_like(p)
    plain.step()
    o = MasterWeightAdamW([p], lr=1e-6, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    o.load_state_dict(plain.state_dict())
    o.step()
    assert o.state[p]["master"].dtype == torch.float32 and o.state[p]["exp_avg_sq"].dtype == torch.float32


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao not installed")
def test_adamw_8bit_with_bf16_weights_rounds_stochastically():
    from torchao.optim import AdamW8bit

    bf16 = [torch.nn.Parameter(torch.zeros(64, 64, dtype=torch.bfloat16))]
    opt = build_optimizer(bf16, _cfg(optimizer="adamw_8bit"), torch.device("cpu"))
    assert isinstance(opt, AdamW8bit) and opt.bf16_stochastic_round
    fp32 = [torch.nn.Parameter(torch.zeros(64, 64))]
    assert not build_optimizer(fp32, _cfg(optimizer="adamw_8bit"), torch.device("cpu")).bf16_stochastic_round


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao not installed")
def test_resume_keeps_torchao_learning_rate_a_tensor():
    """torchao's optimizers keep ``lr`` a tensor and refuse a float at the next step."""
    cfg = _cfg(optimizer="adamw_8bit")
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(64, 64))], cfg, torch.device("cpu"))
    cfg.optim.learning_rate = 3e-6
    scheduler = build_scheduler(opt, cfg)
    apply_config_after_resume(opt, scheduler, cfg)
    lr = opt.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor)
    assert float(lr) == pytest.approx(3e-6 * lr_lambda(scheduler.last_epoch, cfg), rel=1e-6)


# ------------------------------------------------------------------------------------- FSDP2 and 8-bit AdamW


@pytest.fixture
def one_rank_mesh(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not HAS_TORCHAO, reason="torchao not installed")
def test_fsdp2_adamw_8bit_never_reaches_bitsandbytes(one_rank_mesh, monkeypatch):
    """Under FSDP2 the parameters are DTensors; bitsandbytes' 8-bit AdamW takes plain CUDA tensors only (its
    open issue: illegal memory access), so a CUDA run must get torchao's, which takes DTensors."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torchao.optim import AdamW8bit

    used = []
    fake = types.ModuleType("bitsandbytes")
    fake.optim = types.SimpleNamespace(AdamW8bit=lambda *a, **k: used.append(a) or torch.optim.SGD(a[0], lr=1))
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    def sharded(dtype):
        return [torch.nn.Parameter(distribute_tensor(torch.zeros(64, 64, dtype=dtype), one_rank_mesh, [Shard(0)]))]

    opt = build_optimizer(sharded(torch.float32), _cfg(optimizer="adamw_8bit"), torch.device("cuda"))  # LoRA
    assert isinstance(opt, AdamW8bit) and not used
    with pytest.raises(OptimizerUnavailable, match="memory.optimizer=adamw"):  # bf16 full fine-tuning
        build_optimizer(sharded(torch.bfloat16), _cfg(optimizer="adamw_8bit"), torch.device("cuda"))
    assert not used
    plain = [torch.nn.Parameter(torch.zeros(64, 64))]  # one GPU, float32: bitsandbytes as before
    build_optimizer(plain, _cfg(optimizer="adamw_8bit"), torch.device("cuda"))
    assert len(used) == 1


def test_fsdp_adamw_8bit_without_torchao_is_refused_at_validation(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    cfg = from_dict(_valid(memory={"optimizer": "adamw_8bit"}, distributed={"strategy": "fsdp"},
                           lora={"enabled": True}))
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    assert "distributed.strategy=fsdp" in str(e.value) and "memory.optimizer=adamw" in str(e.value)
    assert "slimgrpo[ao]" in str(e.value)


def test_fsdp_adamw_8bit_with_bf16_full_finetuning_is_refused_at_validation():
    cfg = from_dict(_valid(model={"dtype": "bfloat16"}, memory={"optimizer": "adamw_8bit"},
                           distributed={"strategy": "fsdp"}))
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    msg = str(e.value)
    assert "distributed.strategy=fsdp with memory.optimizer=adamw_8bit" in msg and "DTensor" in msg
    assert "memory.optimizer=adamw" in msg and "lora.enabled=true" in msg
    validate_config(from_dict(_valid(model={"dtype": "bfloat16"}, memory={"optimizer": "adamw_8bit"},
                                     distributed={"strategy": "fsdp"}, lora={"enabled": True})))


def test_bf16_stochastic_round_without_torchao_is_refused_at_validation(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    cfg = from_dict(_valid(model={"dtype": "bfloat16"}, memory={"optimizer": "adamw_8bit"}, run={"device": "cpu"}))
    with pytest.raises(ConfigError, match="memory.bf16_update=auto"):
        validate_config(cfg)
    validate_config(from_dict(_valid(model={"dtype": "bfloat16"}, run={"device": "cpu"})))  # adamw: master


def test_fp32_master_with_8bit_adamw_is_refused_at_validation():
    cfg = from_dict(_valid(memory={"optimizer": "adamw_8bit", "bf16_update": "fp32_master"}))
    with pytest.raises(ConfigError, match="memory.bf16_update=fp32_master with memory.optimizer=adamw_8bit"):
        validate_config(cfg)


# ------------------------------------------------------------------------------------- float16


def test_float16_full_finetuning_is_refused_at_validation():
    cfg = from_dict(_valid(model={"dtype": "float16"}, run={"device": "cuda"}))
    with pytest.raises(ConfigError) as e:
        validate_config(cfg)
    msg = str(e.value)
    assert "model.dtype=float16" in msg and "lora.enabled=false" in msg and "master" in msg
    assert "model.dtype=bfloat16" in msg
    validate_config(from_dict(_valid(model={"dtype": "float16"}, run={"device": "cuda"}, lora={"enabled": True})))


def test_trl_fp16_maps_only_with_peft():
    from slimgrpo.trl import BY_KEY
    from slimgrpo.config.trl_rules import Refused

    with pytest.raises(Refused, match="master copy"):
        BY_KEY["fp16"].apply(True, {"fp16": True})
    assert BY_KEY["fp16"].apply(True, {"fp16": True, "use_peft": True}) == {"model.dtype": "float16"}
    assert BY_KEY["fp16"].apply(False, {}) == {}
    assert BY_KEY["bf16"].apply(True, {"bf16": True}) == {"model.dtype": "bfloat16"}


# ------------------------------------------------------------------------------------- the plan


def _plan(**sections):
    from slimgrpo.runspec.run import run_spec
    from slimgrpo.plan.model import plan_memory
    from slimgrpo.runspec.shape import preset_shapes

    world = sections.pop("_world", 1)
    shape = preset_shapes()["qwen2.5-0.5b"]
    x = run_spec(from_dict(_valid(**sections)), "cuda", world_size=world)
    return shape, {c.name: c for c in plan_memory(shape, x).components}


def test_plan_counts_fp32_master_weights():
    shape, plain = _plan(model={"dtype": "bfloat16"}, memory={"bf16_update": "plain"})
    _, master = _plan(model={"dtype": "bfloat16"})  # auto with adamw: master weights
    _, rounded = _plan(model={"dtype": "bfloat16"}, memory={"bf16_update": "stochastic_round"})
    n = shape.num_params
    assert "fp32 master weights" not in plain and "fp32 master weights" not in rounded
    assert master["fp32 master weights"].bytes == 4 * n
    assert master["optimizer state"].bytes == 8 * n and plain["optimizer state"].bytes == 4 * n  # fp32 moments
    assert rounded["optimizer state"].bytes == plain["optimizer state"].bytes  # stochastic rounding is free
    _, lora = _plan(model={"dtype": "bfloat16"}, lora={"enabled": True})
    assert "fp32 master weights" not in lora  # the adapters are float32 already
    _, fp32 = _plan(model={"dtype": "float32"})
    assert "fp32 master weights" not in fp32


def test_plan_shards_fp32_master_weights_under_fsdp2():
    shape, one = _plan(model={"dtype": "bfloat16"})
    _, four = _plan(model={"dtype": "bfloat16"}, distributed={"strategy": "fsdp"}, _world=4)
    assert four["fp32 master weights"].bytes == -(-one["fp32 master weights"].bytes // 4)



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_rules_keep_small_updates():
    """On a GPU: the fused master-weight step and torchao's stochastic rounding (compiled with triton)."""
    start = _small_model()
    grads = bf16_update.gradients({n: t.shape for n, t in start.items()}, steps=10)
    rules = ("plain", "fp32_master") + (("stochastic_round",) if HAS_TORCHAO else ())
    rows = {r["variant"]: r for r in bf16_update.measure(start, grads, lrs=(1e-6,), rules=rules,
                                                         device=torch.device("cuda"))}
    assert rows["bf16 fp32_master"]["master_rel_dist"] < 1e-3
    if HAS_TORCHAO:
        assert rows["bf16 stochastic_round"]["changed"] > rows["bf16 plain"]["changed"]


@pytest.mark.parametrize("overrides,what", [
    (["lora.enabled=true", "model.load_in_4bit=true"], "model.load_in_4bit=true"),
    (["memory.optimizer=adamw_8bit", "lora.enabled=true"], "memory.optimizer=adamw_8bit"),
    (["memory.optimizer=adamw_8bit", "model.dtype=float32"], "memory.optimizer=adamw_8bit"),
])
def test_a_missing_bitsandbytes_is_said_at_validation_with_the_install_line(overrides, what, monkeypatch):
    """On a GPU, a 4-bit base and bitsandbytes' 8-bit AdamW need bitsandbytes: refused before the plan and the
    weights, naming the key and the install line, where it is not installed (find_spec patched)."""
    import importlib.util

    from slimgrpo.config.precision import bitsandbytes_problem

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a))
    cfg = from_dict(merge_overrides({}, ["run.device=cuda", *overrides]))
    problem = bitsandbytes_problem(cfg, on_cpu=False)
    assert problem and what in problem and "pip install 'slimgrpo[gpu]'" in problem
    assert bitsandbytes_problem(cfg, on_cpu=True) is None  # CPU: no bitsandbytes involved (8-bit AdamW: torchao)
    stochastic = from_dict(merge_overrides({}, ["run.device=cuda", "memory.optimizer=adamw_8bit",
                                                "model.dtype=bfloat16"]))
    assert bitsandbytes_problem(stochastic, on_cpu=False) is None  # torchao's, with stochastic rounding
