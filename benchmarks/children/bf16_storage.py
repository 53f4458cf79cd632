"""One ``slimgrpo train`` run whose trained weights are stored as bfloat16 values while the model computes in
float32: bfloat16 full fine-tuning's update rules on a CPU without bfloat16 matrix kernels.

    python -m benchmarks.children.bf16_storage {plain,fp32_master} train RECIPE key=value ...

learning/bf16_learn.py starts it. This machine's CPU (AVX2, no AVX512-BF16 / AMX) multiplies bfloat16 matrices 20-30x
slower than float32 (a 64 x 576 x 1536 product: 404 ms against 12 ms), so a real bfloat16 run of the addition
recipe takes hours here. What issue 42 is about is the update, not the forward: the trained weights start
rounded to bfloat16 and, after every optimizer step, hold bfloat16 values:

- ``plain``: torch's AdamW, then every trained weight and both moments rounded to nearest bfloat16: what
  AdamW does on bfloat16 weights (torch's fused kernel computes in float32 and stores bfloat16).
- ``fp32_master``: AdamW steps a float32 master copy of each weight; the weight the forward sees is the master
  rounded to nearest bfloat16, as ``memory.bf16_update=fp32_master`` (update/optim.py MasterWeightAdamW).

Activations, gradients and sampling stay float32; a real bfloat16 run on a GPU also rounds those.
"""

from __future__ import annotations

import sys

import torch


def _round_(t: torch.Tensor) -> None:
    t.copy_(t.to(torch.bfloat16))


class PlainBf16AdamW(torch.optim.AdamW):
    """AdamW whose weights and moments are stored as bfloat16 values."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        for group in self.param_groups:
            for p in group["params"]:
                _round_(p)
                for key in ("exp_avg", "exp_avg_sq"):
                    if key in self.state[p]:
                        _round_(self.state[p][key])
        return loss


class MasterBf16AdamW(torch.optim.AdamW):
    """AdamW on float32 masters; the model's weights are the masters rounded to bfloat16 values."""

    @torch.no_grad()
    def step(self, closure=None):
        shown = {}
        masters = self.__dict__.setdefault("masters", {})  # beside torch's state, which AdamW fills itself
        for group in self.param_groups:
            for p in group["params"]:
                master = masters.setdefault(p, p.detach().clone())
                shown[p] = p.data
                p.data = master  # the step updates the master in place
        loss = super().step(closure)
        for p, data in shown.items():
            data.copy_(p.data.to(torch.bfloat16))
            p.data = data
        return loss


def main() -> int:
    mode, argv = sys.argv[1], sys.argv[2:]
    from benchmarks.surface import cli_main, train_build

    real = train_build.build_optimizer  # where the run's build looks it up (train/build.py)

    def build(params, cfg, device):
        assert all(p.dtype == torch.float32 for p in params), "emulation runs with model.dtype=float32"
        with torch.no_grad():
            for p in params:
                _round_(p)  # the trained weights start as bfloat16 values
        o = cfg.optim
        cls = {"plain": PlainBf16AdamW, "fp32_master": MasterBf16AdamW}[mode]
        opt = cls(params, lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_epsilon,
                  weight_decay=o.weight_decay)
        print(f"bf16 storage emulated: {mode} ({type(opt).__name__}; {real.__module__}.build_optimizer replaced)",
              flush=True)
        return opt

    train_build.build_optimizer = build
    return cli_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
