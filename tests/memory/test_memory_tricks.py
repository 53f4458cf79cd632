"""Memory tricks change memory, never the numbers: checkpointing, CPU offload of checkpoints,
micro-batching and the LoRA reference (adapters disabled) against the plain computation."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from slimgrpo.loss.objectives import LossSettings, Normaliser
from _update_calls import UpdateBatch, accumulate_gradients, batch_logprobs


def make_batch(vocab, rows=6, P=5, T=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(3, vocab, (rows, P), generator=g)
    prompt_mask = torch.ones(rows, P, dtype=torch.bool)
    prompt_mask[0, :2] = False  # left padding
    comp = torch.randint(3, vocab, (rows, T), generator=g)
    comp_mask = torch.ones(rows, T, dtype=torch.bool)
    comp_mask[1, 4:] = False  # ragged completion lengths
    comp_mask[3, 2:] = False
    ids = torch.cat([prompt.masked_fill(~prompt_mask, 0), comp.masked_fill(~comp_mask, 0)], 1)
    am = torch.cat([prompt_mask, comp_mask], 1).long()
    adv = torch.randn(rows, generator=g)
    return UpdateBatch(ids, am, comp.masked_fill(~comp_mask, 0), comp_mask, adv)


def grads_of(model, batch, micro=None, offload=False, ckpt=False, loss_type="dapo"):
    model = copy.deepcopy(model)
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    settings = LossSettings(loss_type=loss_type, max_completion_length=batch.T)
    norm = Normaliser(num_sequences=batch.rows, num_tokens=int(batch.loss_mask.sum()))
    accumulate_gradients(model, batch, settings, norm, micro, 1.0, 4, None, offload_activations=offload)
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo", "dr_grpo"])
def test_checkpointing_offload_and_microbatching_keep_gradients(model, loss_type):
    batch = make_batch(model.config.vocab_size)
    ref = grads_of(model, batch, loss_type=loss_type)
    assert ref
    for kwargs in ({"ckpt": True}, {"ckpt": True, "offload": True}, {"micro": 4}, {"micro": 1, "ckpt": True}):
        got = grads_of(model, batch, loss_type=loss_type, **kwargs)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6, msg=f"{kwargs} {name}")


def test_lora_reference_is_the_base_model_without_a_copy(model):
    from peft import LoraConfig, get_peft_model

    base = copy.deepcopy(model)
    peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(r=4, target_modules="all-linear"))
    for n, p in peft_model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)  # make the adapters matter
    batch = make_batch(model.config.vocab_size)
    with peft_model.disable_adapter():
        ref = batch_logprobs(peft_model, batch, None, 1.0, 4, None)
    expected = batch_logprobs(base, batch, None, 1.0, 4, None)
    policy = batch_logprobs(peft_model, batch, None, 1.0, 4, None)
    torch.testing.assert_close(ref, expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(policy, expected)
    n_params = sum(p.numel() for p in peft_model.parameters())
    assert n_params < 1.5 * sum(p.numel() for p in base.parameters())  # no second copy of the base


def test_adamw_8bit_state_survives_a_checkpoint_round_trip(tmp_path):
    pytest.importorskip("torchao")
    import warnings

    from torchao.optim import AdamW8bit

    from slimgrpo.checkpoint.format import load_nested, save_nested

    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(512, 32))
    q = torch.nn.Parameter(p.detach().clone())
    o1, o2 = AdamW8bit([p], lr=1e-2), AdamW8bit([q], lr=1e-2)
    for o, w in ((o1, p), (o2, q)):
        w.grad = torch.ones_like(w)
        o.step()
    skel = save_nested(o1.state_dict(), tmp_path / "opt.safetensors")
    o2.load_state_dict(load_nested(skel, tmp_path / "opt.safetensors"))
    g = torch.randn_like(p)
    for o, w in ((o1, p), (o2, q)):
        w.grad = g.clone()
        o.step()
    assert torch.equal(p, q)
