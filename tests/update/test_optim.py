"""The optimizer: torch's fused AdamW where it runs, with the same update as the plain implementation."""

import torch

from slimgrpo.config import from_dict
from slimgrpo.update.optim import build_optimizer


def _cfg():
    return from_dict({"model": {"path": "m"}, "optim": {"learning_rate": 1e-2, "weight_decay": 0.1,
                                                        "adam_beta2": 0.99}})


def test_fused_adamw_on_cpu_matches_the_plain_update():
    torch.manual_seed(0)
    shapes = [(7, 5), (13,), (3, 3, 2)]  # sizes no vector width divides
    start = [torch.randn(s) for s in shapes]
    grads = [[torch.randn(s) for s in shapes] for _ in range(3)]
    finals = []
    for fused in (True, False):
        params = [torch.nn.Parameter(t.clone()) for t in start]
        opt = build_optimizer(params, _cfg(), torch.device("cpu"))
        if not fused:
            opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
        assert bool(opt.param_groups[0]["fused"]) is fused
        for step in grads:
            for p, g in zip(params, step):
                p.grad = g.clone()
            opt.step()
        finals.append([p.detach() for p in params])
    for a, b in zip(*finals):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_integer_or_mixed_device_parameters_leave_the_choice_to_torch():
    from slimgrpo.update.optim import _fusable

    assert _fusable([torch.nn.Parameter(torch.zeros(2))], torch.device("cpu")) is True
    assert _fusable([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))], torch.device("cpu")) is None
    assert _fusable([torch.nn.Parameter(torch.zeros(2))], torch.device("cuda")) is None  # parameters not there
