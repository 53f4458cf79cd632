"""LoRA adapters compute in the input's dtype (modeling.InputDtypeLinear): fp32 runs unchanged bit for bit,
bf16 runs equal to a naive fp32-adapter reference within bf16 rounding, and peft's per-projection fp32
input copies gone from what autograd keeps."""

import pytest
import torch

from slimgrpo.config import LoraConfig
from slimgrpo.modeling import InputDtypeLinear, adapters_in_input_dtype, apply_lora

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _tiny(dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=48, intermediate_size=136, num_hidden_layers=2, num_attention_heads=6,
                         num_key_value_heads=2, vocab_size=96, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config).to(dtype).train()


def _peft_default(dtype):
    """peft's own LoRA (fp32 adapters, its input cast on), seeded as apply_lora's model is."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    model = _tiny(dtype)
    torch.manual_seed(1)
    return get_peft_model(model, PeftLoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear",
                                                task_type="CAUSAL_LM"))


def _ours(dtype):
    model = _tiny(dtype)
    torch.manual_seed(1)
    return apply_lora(model, LoraConfig(r=4, alpha=8, dropout=0.0, target_modules="all-linear"))


def _nonzero_b(*models):
    """LoRA B starts at zero; give both models the same nonzero B so the adapters change the output."""
    for model in models:
        torch.manual_seed(2)
        for name, p in sorted(model.named_parameters()):
            if "lora_B" in name:
                with torch.no_grad():
                    p.copy_(torch.randn_like(p) * 0.05)


def _loss_and_grads(model, ids):
    out = model(input_ids=ids)
    loss = out.logits.float().logsumexp(-1).mean()  # shapes that do not divide anything: 2 x 37
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.detach(), out.logits.detach(), grads


def test_every_factor_switched_and_state_dict_unchanged():
    ours, theirs = _ours(torch.bfloat16), _peft_default(torch.bfloat16)
    factors = [m for m in ours.modules() if isinstance(m, InputDtypeLinear)]
    assert len(factors) == 2 * 7 * 2  # lora_A and lora_B of 7 projections in 2 layers
    assert all(m.weight.dtype == torch.float32 for m in factors)  # the adapters stay fp32
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    assert adapters_in_input_dtype(ours) == 0  # once is enough: a second call switches nothing


def _both(dtype):
    """(loss, logits, grads) of ours and of peft's own forward, the same weights (B nonzero) and input."""
    ours, theirs = _ours(dtype), _peft_default(dtype)
    _nonzero_b(ours, theirs)
    ids = torch.randint(0, 96, (2, 37))
    return _loss_and_grads(ours, ids), _loss_and_grads(theirs, ids)


def test_fp32_model_is_unchanged_bit_for_bit():
    (loss_o, logits_o, grads_o), (loss_t, logits_t, grads_t) = _both(torch.float32)
    assert torch.equal(logits_o, logits_t) and torch.equal(loss_o, loss_t)
    assert grads_o.keys() == grads_t.keys()
    for name in grads_o:
        assert torch.equal(grads_o[name], grads_t[name]), name


def test_bf16_model_matches_the_fp32_adapter_reference_within_bf16_rounding():
    (loss_o, logits_o, grads_o), (loss_t, logits_t, grads_t) = _both(torch.bfloat16)
    assert torch.allclose(loss_o, loss_t, rtol=2e-3)
    assert (logits_o.float() - logits_t.float()).abs().max() <= 0.05 * logits_t.float().abs().max()
    for name in grads_o:
        assert grads_o[name].dtype == torch.float32  # the gradient reaches the fp32 weight
        g_o, g_t = grads_o[name].float(), grads_t[name].float()
        cos = torch.nn.functional.cosine_similarity(g_o.flatten(), g_t.flatten(), dim=0)
        assert cos > 0.99, (name, cos)


def test_bf16_adapters_keep_no_fp32_copy_of_the_layer_input():
    """peft's cast keeps an fp32 [rows, S, H] copy per adapted projection; ours keeps none."""

    def fp32_saved_widths(model):
        widths = []

        def pack(t):
            if t.dtype == torch.float32 and t.numel() >= 2 * 37 * 48:  # activation-sized, not an adapter
                widths.append(t.shape[-1])
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=torch.randint(0, 96, (2, 37)))
        return widths

    # Both keep the RMSNorms' fp32 upcast of the residual (width 48, saved by its square and by its scaling;
    # the first norm's input needs no gradient): layer 0's second norm, layer 1's two, the final norm.
    norms = [48] * 8
    assert fp32_saved_widths(_ours(torch.bfloat16)) == norms
    # peft's cast adds one fp32 input per adapted projection and layer: q, k, v, o, gate, up (48) and down (136)
    assert sorted(fp32_saved_widths(_peft_default(torch.bfloat16))) == sorted(norms + 2 * ([48] * 6 + [136]))


def test_a_second_adapter_added_later_is_switched_too():
    from peft import LoraConfig as PeftLoraConfig

    model = _ours(torch.bfloat16)
    model.add_adapter("critic", PeftLoraConfig(r=2, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert adapters_in_input_dtype(model) == 2 * 7 * 2
