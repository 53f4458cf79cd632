"""Chunked LM-head log-probs against the full-logits reference, on awkward shapes."""

from __future__ import annotations

import pytest
import torch
from _reference import naive_token_logprobs

from slimgrpo.forward.rows import CompletionRows, completion_position_ids, lm_head_spec
from slimgrpo.loss.chunked_head import HeadSpec, chunked_token_logprobs
from slimgrpo.config.sections.loss import auto_token_chunk
from slimgrpo.forward.passes import completion_logprobs

ROWS, TOKENS, H, V = 3, 47, 24, 1031  # 141 tokens: divides neither token_chunk nor vocab_chunk
TOKEN_CHUNK = 16
FP32 = dict(rtol=1e-5, atol=1e-5)



pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors, one intra-op thread


TRANSFORMS = {
    "plain": dict(),
    "temperature": dict(temperature=0.7),
    "softcap_scale": dict(softcap=3.0, logit_scale=0.5, temperature=1.3),
}


def _inputs(dtype=torch.float32, bias=True, weight_grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    n = ROWS * TOKENS
    hidden = torch.randn(n, H, generator=g).to(dtype).requires_grad_()
    weight = (0.5 * torch.randn(V, H, generator=g)).to(dtype).requires_grad_(weight_grad)
    b = (0.3 * torch.randn(V, generator=g)).to(dtype).requires_grad_(weight_grad) if bias else None
    targets = torch.randint(0, V, (n,), generator=g)
    upstream = torch.randn(n, generator=g)  # a generic gradient arriving at log p
    return hidden, weight, b, targets, upstream


def _run(fn, hidden, weight, bias, targets, upstream, logit_scale=1.0, softcap=None, **kw):
    """Values, entropy and gradients of ``sum(upstream * logp)`` wrt inputs that need grad."""
    logp, entropy = fn(hidden, HeadSpec(weight, bias, logit_scale, softcap), targets, return_entropy=True, **kw)
    leaves = [t for t in (hidden, weight, bias) if t is not None and t.requires_grad]
    grads = torch.autograd.grad((logp * upstream).sum(), leaves)
    return logp, entropy, grads


@pytest.mark.parametrize("vocab_chunk", [None, 100])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("transform", list(TRANSFORMS))
def test_chunked_matches_naive_fp32(vocab_chunk, bias, transform):
    hidden, weight, b, targets, upstream = _inputs(bias=bias)
    kw = TRANSFORMS[transform]
    got = _run(chunked_token_logprobs, hidden, weight, b, targets, upstream,
               token_chunk=TOKEN_CHUNK, vocab_chunk=vocab_chunk, **kw)
    ref = _run(naive_token_logprobs, hidden, weight, b, targets, upstream, **kw)
    assert got[0].dtype == torch.float32 and got[0].shape == (ROWS * TOKENS,)
    torch.testing.assert_close(got[0], ref[0], **FP32)
    torch.testing.assert_close(got[1], ref[1], **FP32)
    assert not got[1].requires_grad
    for g_got, g_ref in zip(got[2], ref[2], strict=True):
        torch.testing.assert_close(g_got, g_ref, **FP32)


@pytest.mark.parametrize("vocab_chunk", [None, 100])
def test_frozen_head_gives_hidden_grad_only(vocab_chunk):
    """LoRA: the head is frozen; with one vocabulary slice the hidden grad is formed in forward."""
    hidden, weight, b, targets, upstream = _inputs(weight_grad=False)
    kw = dict(temperature=0.9, softcap=4.0)
    got = _run(chunked_token_logprobs, hidden, weight, b, targets, upstream,
               token_chunk=TOKEN_CHUNK, vocab_chunk=vocab_chunk, **kw)
    ref = _run(naive_token_logprobs, hidden, weight, b, targets, upstream, **kw)
    torch.testing.assert_close(got[0], ref[0], **FP32)
    torch.testing.assert_close(got[1], ref[1], **FP32)
    (g_got,), (g_ref,) = got[2], ref[2]
    torch.testing.assert_close(g_got, g_ref, **FP32)


def test_hidden_without_grad_weight_with_grad():
    hidden, weight, b, targets, upstream = _inputs()
    hidden = hidden.detach()
    got = _run(chunked_token_logprobs, hidden, weight, b, targets, upstream,
               token_chunk=TOKEN_CHUNK, vocab_chunk=100)
    ref = _run(naive_token_logprobs, hidden, weight, b, targets, upstream)
    for g_got, g_ref in zip(got[2], ref[2], strict=True):
        torch.testing.assert_close(g_got, g_ref, **FP32)


def test_tied_head_gradient_sums_both_uses():
    """A head tied to the input embeddings gets gradient from the lookup and from the head."""
    _, _, _, targets, upstream = _inputs()
    g = torch.Generator().manual_seed(1)
    inputs = torch.randint(0, V, (ROWS * TOKENS,), generator=g)
    proj = torch.randn(H, H, generator=g) / H**0.5
    grads = []
    for fn in (chunked_token_logprobs, naive_token_logprobs):
        emb = torch.nn.Embedding(V, H)
        with torch.no_grad():
            emb.weight.copy_(0.5 * torch.randn(V, H, generator=torch.Generator().manual_seed(2)))
        hidden = torch.tanh(emb(inputs) @ proj)  # [N, H]
        logp, _ = fn(hidden, HeadSpec(emb.weight), targets, token_chunk=TOKEN_CHUNK, vocab_chunk=100)
        (logp * upstream).sum().backward()
        grads.append(emb.weight.grad)
    torch.testing.assert_close(grads[0], grads[1], **FP32)


@pytest.mark.parametrize("vocab_chunk", [None, 100])
def test_no_grad_path(vocab_chunk):
    hidden, weight, b, targets, _ = _inputs()
    head = HeadSpec(weight, b, softcap=5.0)
    kw = dict(temperature=1.2, return_entropy=True)
    with torch.no_grad():
        logp, entropy = chunked_token_logprobs(hidden, head, targets, token_chunk=TOKEN_CHUNK,
                                               vocab_chunk=vocab_chunk, **kw)
        ref_logp, ref_entropy = naive_token_logprobs(hidden, head, targets, **kw)
    assert logp.grad_fn is None and entropy.grad_fn is None
    torch.testing.assert_close(logp, ref_logp, **FP32)
    torch.testing.assert_close(entropy, ref_entropy, **FP32)


@pytest.mark.parametrize("vocab_chunk", [None, 100])
def test_bf16_within_bound(vocab_chunk):
    """bf16 inputs: both paths round the logits to bf16 in the matmul, then work in fp32.

    Bound: |d logp| and |d entropy| <= 0.05 (one bf16 ulp of a logit of magnitude <= 8, in case
    the two matmuls round differently; 2e-6 observed on CPU) and gradients within 1% of their
    norm (both round the logit gradient to bf16 for the matmuls, at different points; 0.3%
    observed).
    """
    hidden, weight, b, targets, upstream = _inputs(dtype=torch.bfloat16)
    got = _run(chunked_token_logprobs, hidden, weight, b, targets, upstream,
               token_chunk=TOKEN_CHUNK, vocab_chunk=vocab_chunk, temperature=0.8)
    ref = _run(naive_token_logprobs, hidden, weight, b, targets, upstream, temperature=0.8)
    assert got[0].dtype == torch.float32
    assert (got[0] - ref[0]).abs().max() <= 0.05
    assert (got[1] - ref[1]).abs().max() <= 0.05
    for g_got, g_ref, leaf in zip(got[2], ref[2], (hidden, weight, b), strict=True):
        assert g_got.dtype == leaf.dtype == torch.bfloat16
        rel = (g_got.float() - g_ref.float()).norm() / g_ref.float().norm()
        assert rel <= 0.01


def test_auto_token_chunk_bounds_the_block():
    from slimgrpo.config import auto_token_chunk as trainings

    assert auto_token_chunk is trainings  # one default: what a run uses (loss.token_chunk=None)
    assert auto_token_chunk(151_936) == 64  # 64 x 151,936 x 4 B = 37 MiB <= 64 MiB
    assert auto_token_chunk(32_000) == 512
    assert auto_token_chunk(151_936, vocab_chunk=8192) == 2048  # the block is [tokens, vocab_chunk]
    hidden, weight, b, targets, _ = _inputs()
    with torch.no_grad():  # the default path (auto chunk) agrees with the naive one
        logp, _ = chunked_token_logprobs(hidden, HeadSpec(weight, b), targets)
        ref, _ = naive_token_logprobs(hidden, HeadSpec(weight, b), targets)
    torch.testing.assert_close(logp, ref, **FP32)


def test_bad_inputs_raise():
    hidden, weight, _, targets, _ = _inputs()
    head = HeadSpec(weight)
    with pytest.raises(ValueError, match="targets"):
        chunked_token_logprobs(hidden, head, targets[:-1])
    with pytest.raises(ValueError, match="hidden"):
        chunked_token_logprobs(hidden[:, :-1], head, targets)
    with pytest.raises(ValueError, match="temperature"):
        chunked_token_logprobs(hidden, head, targets, temperature=0.0)
    with pytest.raises(ValueError, match="chunk"):
        chunked_token_logprobs(hidden, head, targets, token_chunk=0)
    with pytest.raises(ValueError, match="token ids"):
        chunked_token_logprobs(hidden, head, torch.full_like(targets, V))
    with pytest.raises(ValueError, match="dtype"):
        chunked_token_logprobs(hidden.bfloat16(), head, targets)


# --- completion_logprobs on tiny Hugging Face models ---------------------------------------------

transformers = pytest.importorskip("transformers")
SMALL = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
P, T = 7, 6


def _tiny(config_cls, **extra):
    torch.manual_seed(0)
    config = config_cls(**{**SMALL, **extra})
    return transformers.AutoModelForCausalLM.from_config(config).float().eval()


def _batch(seed=0):
    """Left-padded prompts + right-padded completions, [rows, P + T]."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (ROWS, P + T), generator=g)
    mask = torch.ones(ROWS, P + T, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    mask[1, :1] = 0
    mask[2, -2:] = 0  # a completion that stopped early
    mask[0, -1:] = 0
    return ids, mask


def _naive_completion(model, ids, mask, temperature=1.0):
    out = model(input_ids=ids, attention_mask=mask, position_ids=completion_position_ids(mask))
    logits = out.logits[:, -T - 1 : -1].float() / temperature  # [rows, T, V]
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, ids[:, -T:, None]).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


def _forbid_full_logits(model):
    def hook(*_):
        raise AssertionError("the LM head module was called: full logits were computed")
    return model.get_output_embeddings().register_forward_hook(hook)


def test_completion_logprobs_qwen2_left_padded():
    model = _tiny(transformers.Qwen2Config, tie_word_embeddings=True)
    ids, mask = _batch()
    handle = _forbid_full_logits(model)
    logp, entropy = completion_logprobs(model, CompletionRows(ids, mask, T, ids[:, -T:]), temperature=0.9,
                                        token_chunk=5, return_entropy=True)
    handle.remove()
    ref_logp, ref_entropy = _naive_completion(model, ids, mask, temperature=0.9)
    scored = mask[:, -T:].bool()
    torch.testing.assert_close(logp[scored], ref_logp[scored], **FP32)
    torch.testing.assert_close(entropy[scored], ref_entropy[scored], **FP32)
    assert (logp[~scored] == 0).all()
    # Left padding does not shift positions: row 0 scored on its own, unpadded, agrees.
    alone, _ = completion_logprobs(model, CompletionRows(ids[:1, 3:], mask[:1, 3:], T, ids[:1, -T:]),
                                   temperature=0.9)
    torch.testing.assert_close(alone[0, :-1], logp[0, :-1], **FP32)


@pytest.mark.parametrize("family", ["gemma2", "cohere", "granite"])
def test_head_transforms_of_model_families(family):
    config_cls, extra = {
        "gemma2": (transformers.Gemma2Config,
                   dict(final_logit_softcapping=2.0, head_dim=8, query_pre_attn_scalar=8)),
        "cohere": (transformers.CohereConfig, dict(logit_scale=0.25)),
        "granite": (transformers.GraniteConfig, dict(logits_scaling=3.0)),
    }[family]
    model = _tiny(config_cls, **extra)
    spec = lm_head_spec(model)
    assert (spec.softcap, spec.logit_scale) == {
        "gemma2": (2.0, 1.0), "cohere": (None, 0.25), "granite": (None, 1 / 3.0)}[family]
    ids, mask = _batch(seed=1)
    logp, _ = completion_logprobs(model, CompletionRows(ids, mask, T, ids[:, -T:]), token_chunk=4)
    ref, _ = _naive_completion(model, ids, mask)
    scored = mask[:, -T:].bool()
    torch.testing.assert_close(logp[scored], ref[scored], **FP32)


def test_completion_logprobs_peft_lora_values_and_grads():
    peft = pytest.importorskip("peft")
    model = _tiny(transformers.Qwen2Config, tie_word_embeddings=False)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:  # zero at init: make the adapter matter
                param.normal_(0.0, 0.5)
    ids, mask = _batch(seed=2)
    scored = mask[:, -T:].bool()
    upstream = torch.randn(ROWS, T, generator=torch.Generator().manual_seed(3)) * scored
    lora_params = [p for n, p in lora.named_parameters() if "lora_" in n]

    logp, _ = completion_logprobs(lora, CompletionRows(ids, mask, T, ids[:, -T:]), token_chunk=5)
    grads = torch.autograd.grad((logp * upstream).sum(), lora_params)
    ref, _ = _naive_completion(lora, ids, mask)
    ref_grads = torch.autograd.grad((ref * upstream).sum(), lora_params)
    torch.testing.assert_close(logp[scored], ref[scored], **FP32)
    for g_got, g_ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g_got, g_ref, **FP32)
    with lora.disable_adapter(), torch.no_grad():
        base, _ = completion_logprobs(lora, CompletionRows(ids, mask, T, ids[:, -T:]))
    assert (base - logp.detach())[scored].abs().max() > 1e-2  # the adapter was really applied


def test_lora_on_lm_head_is_rejected():
    peft = pytest.importorskip("peft")
    model = _tiny(transformers.Qwen2Config, tie_word_embeddings=False)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj", "lm_head"]))
    with pytest.raises(ValueError, match="lm_head"):
        lm_head_spec(lora)


def test_completion_logprobs_bad_shapes():
    model = _tiny(transformers.Qwen2Config)
    ids, mask = _batch()
    with pytest.raises(ValueError, match="num_completion_tokens"):
        completion_logprobs(model, CompletionRows(ids, mask, P + T, ids))
    with pytest.raises(ValueError, match="completion_ids"):
        completion_logprobs(model, CompletionRows(ids, mask, T, ids[:, -T + 1 :]))


def test_peft_modules_to_save_head_is_followed():
    """With modules_to_save=["lm_head"] the trained copy is used, and the original when disabled."""
    peft = pytest.importorskip("peft")
    model = _tiny(transformers.Qwen2Config, tie_word_embeddings=False)
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"],
                                                      modules_to_save=["lm_head"]))
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "modules_to_save" in name and name.endswith("weight"):
                param.mul_(1.5)
    ids, mask = _batch(seed=4)
    scored = mask[:, -T:].bool()
    results = []
    with torch.no_grad():
        for disabled in (False, True):
            ctx = lora.disable_adapter() if disabled else torch.no_grad()
            with ctx:
                logp, _ = completion_logprobs(lora, CompletionRows(ids, mask, T, ids[:, -T:]))
                ref, _ = _naive_completion(lora, ids, mask)
            torch.testing.assert_close(logp[scored], ref[scored], **FP32)
            results.append(logp)
    assert (results[0] - results[1])[scored].abs().max() > 1e-2  # the two heads really differ
