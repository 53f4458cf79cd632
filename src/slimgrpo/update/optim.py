"""Optimizer and learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch.optim.adamw import adamw as adamw_update

from slimgrpo.config import Config
from slimgrpo.config.sections.memory import bf16_update_rule
from slimgrpo.config.precision import FSDP_BF16_8BIT


class OptimizerUnavailable(RuntimeError):
    """The configured optimizer needs a package or device that is missing."""


def build_optimizer(params: list[torch.nn.Parameter], cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer of ``memory.optimizer``; bfloat16 weights are stepped by ``memory.bf16_update``'s rule
    (``bf16_update_rule``: float32 master weights or torchao's stochastic rounding), so that updates far
    below a bfloat16 step (learning rates of 1e-6 .. 1e-5 on weights of ~0.02) are not rounded away."""
    o = cfg.optim
    kwargs = dict(lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_epsilon,
                  weight_decay=o.weight_decay)
    if not params:
        raise ValueError("the model has no trainable parameters (check lora.target_modules)")
    bf16 = any(p.dtype == torch.bfloat16 for p in params)
    rule = bf16_update_rule(cfg.memory.bf16_update, cfg.memory.optimizer) if bf16 else "plain"
    if cfg.memory.optimizer == "adamw":
        if rule == "fp32_master":
            return MasterWeightAdamW(params, fused=_fusable(params, device), **kwargs)
        if rule == "stochastic_round":
            # torchao's AdamW (float32 math, moments in the parameter's dtype) with its bf16 stochastic
            # rounding; the class carries a leading underscore in torchao 0.18 but is its documented way to
            # train bf16 weights without a master copy.
            return _torchao("_AdamW", "memory.bf16_update=stochastic_round")(params, bf16_stochastic_round=True,
                                                                             **kwargs)
        # torch's fused kernel: one pass over each tensor instead of a chain of elementwise ops (on this
        # project's 2-core CPU 0.09 s against 0.31-0.40 s per step for 135M parameters); same update rule.
        return torch.optim.AdamW(params, fused=_fusable(params, device), **kwargs)
    if rule == "fp32_master":
        raise OptimizerUnavailable("memory.bf16_update=fp32_master is for memory.optimizer=adamw; 8-bit AdamW "
                                   "keeps bfloat16 updates by memory.bf16_update=stochastic_round (or auto)")
    # 8-bit AdamW: torchao's where parameters are sharded DTensors (FSDP2: bitsandbytes' kernels take plain
    # CUDA tensors only and fail with an illegal memory access on DTensors), where bf16 weights need its
    # stochastic rounding, and on CPU; bitsandbytes' on one GPU otherwise. Never a silent 32-bit fallback.
    if bf16 and _sharded(params):  # validation refuses this first (config/precision.py)
        raise OptimizerUnavailable(
            "memory.optimizer=adamw_8bit under FSDP2 with bfloat16 weights: no 8-bit AdamW steps bfloat16 "
            f"DTensors here ({FSDP_BF16_8BIT}); use memory.optimizer=adamw or LoRA")
    if device.type == "cuda" and not _sharded(params) and rule == "plain":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise OptimizerUnavailable(
                "memory.optimizer=adamw_8bit on CUDA needs bitsandbytes: pip install 'slimgrpo[gpu]'"
            ) from None
        return bnb.optim.AdamW8bit(params, **kwargs)
    why = ("under FSDP2 (distributed.strategy=fsdp)" if _sharded(params) else
           "for bfloat16 weights (memory.bf16_update)" if rule == "stochastic_round" else "on CPU")
    return _torchao("AdamW8bit", f"memory.optimizer=adamw_8bit {why}")(
        params, bf16_stochastic_round=rule == "stochastic_round", **kwargs)


def _torchao(name: str, what: str):
    """A torchao optimizer class, or OptimizerUnavailable naming the setting that needs it."""
    try:
        import torchao.optim as ao
    except ImportError:
        raise OptimizerUnavailable(
            f"{what} needs torchao (pip install 'slimgrpo[ao]'); or use memory.optimizer=adamw with "
            "memory.bf16_update=fp32_master"
        ) from None
    return getattr(ao, name)


def _sharded(params: list[torch.nn.Parameter]) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in params)


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW that steps each bfloat16 / float16 parameter through a float32 master copy, kept in the
    optimizer state (``state[p]["master"]``, on the parameter's device and, under FSDP2, a DTensor sharded
    like it) with float32 moments; the parameter is the master rounded to nearest after every step.
    Float32 parameters (LoRA adapters, a value head) are stepped in place. The update itself is torch's
    AdamW (``torch.optim.adamw.adamw``, fused where ``fused``). The state is keyed by the model's own
    parameters, so checkpoints (one process and DCP) map it by name as for torch's AdamW."""

    def __init__(self, params, lr: float, betas: tuple[float, float], eps: float, weight_decay: float,
                 fused: bool | None = None) -> None:
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.fused = fused

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                weight, state = self._state_of(p)
                grad = p.grad if weight is p else p.grad.float()  # one tensor's float32 copy at a time
                adamw_update(
                    [weight], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
                    fused=self.fused, amsgrad=False, beta1=group["betas"][0], beta2=group["betas"][1],
                    lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
                if weight is not p:
                    p.copy_(weight)
        return loss

    def _state_of(self, p: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """(the tensor the step updates, the state); created on the first step. A state without a master
        (a checkpoint saved by plain AdamW) gets one from the weight, its moments widened to float32."""
        state = self.state[p]
        low = p.dtype in (torch.bfloat16, torch.float16)
        if low and "master" not in state:
            state["master"] = p.detach().to(torch.float32, copy=True)
        weight = state["master"] if low else p
        if "step" not in state:
            on = p.device if self.fused else torch.device("cpu")
            state["step"] = torch.zeros((), dtype=torch.float32, device=on)
            state["exp_avg"] = torch.zeros_like(weight, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(weight, memory_format=torch.preserve_format)
        for key in ("exp_avg", "exp_avg_sq"):
            if state[key].dtype != weight.dtype:
                state[key] = state[key].to(weight.dtype)
        if self.fused and state["step"].device != p.device:  # the fused kernel reads the count on the device
            state["step"] = state["step"].to(device=p.device, dtype=torch.float32)
        return weight, state

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's ``Optimizer.load_state_dict`` casts every floating state tensor to its parameter's dtype;
        a master copy and its moments are float32 by design, so they are put back from ``state_dict`` at
        full precision (else a resumed bf16 run would restart from rounded masters)."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(saved_ids, params):
            saved = state_dict["state"].get(pid, {})
            if "master" in saved:
                for key in ("master", "exp_avg", "exp_avg_sq"):
                    self.state[p][key] = saved[key].to(device=p.device, dtype=torch.float32)


def _fusable(params: list[torch.nn.Parameter], device: torch.device) -> bool | None:
    """True where torch's fused AdamW runs: plain (not sharded DTensor) floating-point tensors on CPU or
    CUDA; None (torch's own choice) elsewhere."""
    plain = all(type(p.data) is torch.Tensor and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
                for p in params)
    return True if plain and device.type in ("cpu", "cuda") and all(p.device.type == device.type for p in params) else None


def warmup_steps(cfg: Config) -> int:
    """Warmup in optimizer steps: ``optim.warmup_steps`` when >= 1, else that fraction (or
    ``optim.warmup_ratio``) of ``run.max_steps`` rounded up, as transformers' ``get_warmup_steps``."""
    o, total = cfg.optim, cfg.run.max_steps
    if o.warmup_steps >= 1:
        return int(o.warmup_steps)
    return math.ceil(total * (o.warmup_steps or o.warmup_ratio))


def lr_lambda(step: int, cfg: Config) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based)."""
    o, total, warmup = cfg.optim, cfg.run.max_steps, warmup_steps(cfg)
    if warmup and step < warmup:
        return (step + 1) / warmup
    if o.lr_scheduler_type == "constant":
        return 1.0
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    if o.lr_scheduler_type == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress  # linear


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: Config) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_lambda(step, cfg))


def apply_config_after_resume(optimizer: torch.optim.Optimizer, scheduler, cfg: Config) -> None:
    """A checkpoint's optimizer and scheduler state carry the hyperparameters they were saved with; the
    config's win (a checkpoint named by ``run.resume`` may resume with a changed ``optim.*``, e.g. a lower
    learning rate after a divergence). The schedule's position (``last_epoch``) is kept."""
    o = cfg.optim
    wanted = {"initial_lr": o.learning_rate, "betas": (o.adam_beta1, o.adam_beta2), "eps": o.adam_epsilon,
              "weight_decay": o.weight_decay}
    for group in optimizer.param_groups:
        group.update({k: v for k, v in wanted.items() if k in group or k == "initial_lr"})
        lr = o.learning_rate * lr_lambda(scheduler.last_epoch, cfg)
        if isinstance(group["lr"], torch.Tensor):  # torchao's optimizers keep lr a tensor and refuse a float
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    scheduler.base_lrs = [o.learning_rate] * len(optimizer.param_groups)
    scheduler._last_lr = [float(group["lr"]) for group in optimizer.param_groups]  # what get_last_lr() reports
