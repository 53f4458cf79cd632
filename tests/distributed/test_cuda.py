"""Checks that need a CUDA GPU (marker ``cuda``; skipped without one). ``pytest -m cuda`` runs them;
python -m benchmarks.gpu.suite does too and puts the result in its report. The activation-offload twin
lives in test_offload.py."""

from __future__ import annotations

import pytest
import torch

from slimgrpo.runspec.shape import ModelShape, load_shape
from slimgrpo.trace.synthetic import UpdateOnly, random_causal_lm, synthetic_rollout, update_config

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SMALL = ModelShape(family="qwen2", hidden=256, intermediate=768, layers=4, heads=8, kv_heads=2, vocab=4099,
                   tie=True, max_positions=2048)


def test_chunked_loss_bf16_weights_fp32_accumulation_matches_naive():
    from _reference import naive_token_logprobs

    from slimgrpo.loss.chunked_head import HeadSpec, chunked_token_logprobs

    g = torch.Generator().manual_seed(0)
    N, H, V = 1037, 256, 50_003  # shapes that divide no chunk size
    h = (torch.randn(N, H, generator=g) * 0.5).cuda().bfloat16().requires_grad_(True)
    w = (torch.randn(V, H, generator=g) * 0.02).cuda().bfloat16().requires_grad_(True)
    y = torch.randint(0, V, (N,), generator=g).cuda()
    logp, _ = chunked_token_logprobs(h, HeadSpec(w), y, token_chunk=300, vocab_chunk=7000)
    assert logp.dtype == torch.float32
    (logp * torch.linspace(-1, 1, N, device="cuda")).sum().backward()
    # Reference: the same bf16 values, everything in fp32.
    h32 = h.detach().float().requires_grad_(True)
    w32 = w.detach().float().requires_grad_(True)
    ref, _ = naive_token_logprobs(h32, HeadSpec(w32), y)
    (ref * torch.linspace(-1, 1, N, device="cuda")).sum().backward()
    torch.testing.assert_close(logp, ref, rtol=0, atol=2e-2)
    torch.testing.assert_close(h.grad.float(), h32.grad, rtol=0.05, atol=2e-3)
    torch.testing.assert_close(w.grad.float(), w32.grad, rtol=0.05, atol=2e-3)


def test_rollout_greedy_equals_hf_generate_on_cuda():
    from slimgrpo.rollout import SamplingParams, TorchRolloutEngine

    shape = ModelShape(family="qwen2", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=512,
                       tie=True, max_positions=256)
    # peaked logits (as in test_rollout.py): greedy decoding has no near-ties to flip
    model = random_causal_lm(shape, torch.float32, "cuda", initializer_range=0.2).eval()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    params = SamplingParams(max_new_tokens=12, temperature=0.0, eos_token_ids=(), pad_token_id=0)
    ro = TorchRolloutEngine(model).generate(prompts, 1, params)
    P = max(map(len, prompts))
    ids = torch.zeros(len(prompts), P, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    out = model.generate(input_ids=ids.cuda(), attention_mask=mask.cuda(), do_sample=False, max_new_tokens=12,
                         pad_token_id=0, eos_token_id=None)
    assert torch.equal(ro.completion_ids, out[:, P:])


def test_bitsandbytes_adamw_8bit_step():
    pytest.importorskip("bitsandbytes")
    model = random_causal_lm(SMALL, torch.bfloat16, "cuda")
    runner = UpdateOnly(update_config({"memory": {"optimizer": "adamw_8bit", "bf16_update": "plain"},
                                       "rollout": {"max_completion_length": 64, "num_generations": 2}}), model)
    assert type(runner.trainer.optimizer).__module__.startswith("bitsandbytes")
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    r = runner.step(synthetic_rollout(1, 2, 16, 64, SMALL.vocab, device="cuda"))
    assert not r.skipped and torch.isfinite(torch.tensor(r.loss))
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)


def test_qlora_load_and_one_step(tmp_path):
    pytest.importorskip("bitsandbytes")
    from slimgrpo.config import ModelConfig
    from slimgrpo.modeling import load_model

    random_causal_lm(SMALL, torch.bfloat16, "cuda").save_pretrained(str(tmp_path))
    model = load_model(ModelConfig(path=str(tmp_path), load_in_4bit=True), torch.device("cuda"), torch.bfloat16)
    assert any("4bit" in type(m).__name__ for m in model.modules())
    runner = UpdateOnly(update_config({"model": {"load_in_4bit": True}, "lora": {"enabled": True, "r": 8},
                                       "memory": {"gradient_checkpointing": True},
                                       "rollout": {"max_completion_length": 64, "num_generations": 2}}), model)
    lora = {n: p.detach().clone() for n, p in runner.model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    r = runner.step(synthetic_rollout(1, 2, 16, 64, SMALL.vocab, device="cuda"))
    assert not r.skipped and torch.isfinite(torch.tensor(r.loss))
    assert any(not torch.equal(lora[n], p) for n, p in runner.model.named_parameters() if n in lora)


def test_planner_within_15_percent_of_cuda_peak_update():
    """One small config, update only: planned always + update tensors against max_memory_allocated."""
    from slimgrpo.runspec.run import run_spec
    from slimgrpo.plan.model import plan_memory

    shape = load_shape("qwen2.5-0.5b")
    cfg = update_config({"model": {"dtype": "bfloat16"}, "data": {"max_prompt_length": 128},
                         "rollout": {"max_completion_length": 512, "num_generations": 4},
                         "run": {"batch_size": 4}})
    plan = plan_memory(shape, run_spec(cfg, "cuda", vocab=shape.vocab))
    planned = plan.phase_total("always") + plan.phase_total("update") - plan.framework_bytes
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = random_causal_lm(shape, torch.bfloat16, "cuda")
    UpdateOnly(cfg, model).step(synthetic_rollout(1, 4, 128, 512, shape.vocab, device="cuda"))
    measured = torch.cuda.max_memory_allocated()
    assert abs(planned / measured - 1) <= 0.15, (planned / 2**20, measured / 2**20)


@pytest.mark.parametrize("bf16", [False, True])
def test_cuda_graph_decode_equals_dynamic_greedy(monkeypatch, bf16):
    """SLIMGRPO_CUDA_GRAPHS=1: graphs are captured (and re-captured when rows drop out), greedy tokens
    equal those of the dynamic lean stepper."""
    from slimgrpo.rollout import SamplingParams, TorchRolloutEngine
    from slimgrpo.rollout import cuda_graph

    shape = ModelShape(family="llama", hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=512,
                       tie=False, max_positions=256)
    dtype = torch.bfloat16 if bf16 else torch.float32
    model = random_causal_lm(shape, dtype, "cuda", initializer_range=0.2).eval()
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, eos_token_ids=(), pad_token_id=0)
    monkeypatch.setenv(cuda_graph.ENV, "0")
    dynamic = TorchRolloutEngine(model).generate(prompts, 2, params)
    eos = (int(dynamic.completion_ids[0, 5]),)
    dyn_eos = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(
        prompts, 2, SamplingParams(max_new_tokens=24, temperature=0.0, eos_token_ids=eos, pad_token_id=0))
    monkeypatch.setenv(cuda_graph.ENV, "1")
    made = []
    original = cuda_graph.StaticCacheStepper.__init__

    def spy(self, *a, **k):
        original(self, *a, **k)
        made.append(self)

    monkeypatch.setattr(cuda_graph.StaticCacheStepper, "__init__", spy)
    graphed = TorchRolloutEngine(model).generate(prompts, 2, params)
    assert made and made[0].captures >= 1
    assert torch.equal(graphed.completion_ids, dynamic.completion_ids)
    graphed_eos = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(
        prompts, 2, SamplingParams(max_new_tokens=24, temperature=0.0, eos_token_ids=eos, pad_token_id=0))
    assert torch.equal(graphed_eos.completion_ids, dyn_eos.completion_ids)
