"""TorchRolloutEngine against Hugging Face generate on a tiny random Qwen2."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

from slimgrpo.rollout import RolloutEngine, SamplingParams, TorchRolloutEngine
from slimgrpo.rollout.decode import HFStepper, LlamaStepper, make_stepper

VOCAB, PAD, EOS = 512, 0, 1

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17], [200, 201, 202, 203, 204]]
CONFIGS = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config, "mistral": MistralConfig}


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny tensors, one intra-op thread


def tiny_model(seed: int = 0, arch: str = "qwen2") -> nn.Module:
    torch.manual_seed(seed)
    config = CONFIGS[arch](
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, head_dim=16,
        initializer_range=0.2,  # peaked logits: greedy decoding has no near-ties to flip
        pad_token_id=PAD, eos_token_id=EOS,
    )
    return AutoModelForCausalLM.from_config(config).eval()


def greedy(max_new: int = 12, eos=(EOS,), **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, temperature=0.0, eos_token_ids=eos, pad_token_id=PAD, **kw)


def hf_greedy(model: nn.Module, prompts: list[list[int]], max_new: int, eos=(EOS,)) -> torch.Tensor:
    """HF generate on left-padded prompts; returns the new tokens [B, <=max_new] (pad after EOS)."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), PAD)
    mask = torch.zeros(len(prompts), P, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):], mask[i, P - len(p):] = torch.tensor(p), 1
    out = model.generate(
        input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
        pad_token_id=PAD, eos_token_id=list(eos),
    )
    return out[:, P:]


def padded(t: torch.Tensor, T: int) -> torch.Tensor:
    return torch.nn.functional.pad(t, (0, T - t.shape[1]), value=PAD)


def test_engine_implements_protocol() -> None:
    assert isinstance(TorchRolloutEngine(tiny_model()), RolloutEngine)


@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("lean, pack", [(False, "auto"), (True, "auto"), (True, "all"), (True, "none")])
def test_greedy_matches_hf_generate_with_left_padding(arch: str, lean: bool, pack: str) -> None:
    model = tiny_model(arch=arch)
    ro = TorchRolloutEngine(model, lean_decode=lean, pack_weights=pack).generate(PROMPTS, 1, greedy(eos=()))
    expected = hf_greedy(model, PROMPTS, 12, eos=())
    assert torch.equal(ro.completion_ids, expected)
    # The rollout's prompts are left-padded with a mask marking real tokens.
    assert ro.prompt_ids.shape == (4, 7) and ro.prompt_mask.sum(-1).tolist() == [7, 2, 4, 5]
    assert ro.prompt_ids[1, :5].eq(PAD).all() and ro.prompt_ids[1, 5:].tolist() == [12, 13]
    assert ro.is_truncated.all() and ro.completion_mask.all()


def test_group_rows_share_the_prompt_prefill() -> None:
    model = tiny_model()
    ro = TorchRolloutEngine(model).generate(PROMPTS, 3, greedy(eos=()))
    assert ro.completion_ids.shape == (12, 12) and ro.num_generations == 3
    for g, prompt in enumerate(PROMPTS):
        alone = TorchRolloutEngine(model).generate([prompt], 1, greedy(eos=())).completion_ids[0]
        for r in range(3 * g, 3 * g + 3):
            assert torch.equal(ro.completion_ids[r], alone)


def test_ragged_eos_matches_hf_generate() -> None:
    """Pick EOS ids from the greedy continuations so rows stop at different, known steps."""
    model = tiny_model()
    free = hf_greedy(model, PROMPTS, 12, eos=())
    eos = (int(free[0, 2]), int(free[2, 6]))  # row 0 stops by step 3, row 2 by step 7
    ro = TorchRolloutEngine(model, drop_finished_fraction=0.0).generate(PROMPTS, 2, greedy(eos=eos))
    expected = hf_greedy(model, PROMPTS, 12, eos=eos).repeat_interleave(2, dim=0)
    assert torch.equal(ro.completion_ids, padded(expected, ro.completion_ids.shape[1]))
    lengths = ro.completion_lengths
    assert lengths[0] <= 3 and lengths[4] <= 7 and len(set(lengths.tolist())) > 1
    for r in range(ro.rows):
        n = int(lengths[r])
        ended = any(int(t) in eos for t in ro.completion_ids[r, :n])
        assert ro.is_truncated[r] == (not ended)
        if ended:  # the EOS is the last masked token, padding follows
            assert int(ro.completion_ids[r, n - 1]) in eos
        assert ro.completion_mask[r, :n].all() and not ro.completion_mask[r, n:].any()
        assert ro.completion_ids[r, n:].eq(PAD).all() and ro.sampler_logprobs[r, n:].eq(0).all()


def eos_heavy_model() -> nn.Module:
    """A model that emits EOS with ~6% chance per step: an LM head with a bias on the EOS logit."""
    model = tiny_model()
    old = model.lm_head
    head = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(old.weight * 0.05)
        head.bias.zero_()
        head.bias[EOS] = 3.5
    model.lm_head = head
    return model


def sampled(max_new: int, **kw) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new, eos_token_ids=(EOS,), pad_token_id=PAD, **kw)


@pytest.mark.parametrize(
    "drop, lean, pack", [(0.0, True, "all"), (0.25, True, "auto"), (1.0, True, "none"), (0.0, False, "auto")]
)
def test_sampled_eos_masks_and_logprobs_agree_with_a_full_forward(drop: float, lean: bool, pack: str) -> None:
    model = eos_heavy_model()
    gen = torch.Generator().manual_seed(0)
    engine = TorchRolloutEngine(model, drop_finished_fraction=drop, lean_decode=lean, pack_weights=pack)
    ro = engine.generate(PROMPTS, 4, sampled(20), gen)
    lengths = ro.completion_lengths
    assert len(set(lengths.tolist())) > 3 and ro.is_truncated.any() and not ro.is_truncated.all()
    ids = ro.completion_ids
    for r in range(ro.rows):
        n = int(lengths[r])
        assert (ids[r, : n - 1] != EOS).all() and ids[r, n:].eq(PAD).all()
        assert (ids[r, n - 1] == EOS) != bool(ro.is_truncated[r])
    # Sampler log-probs equal log_softmax of one full forward over prompt + completion.
    prompt, pmask = ro.row_prompt_ids()
    full = torch.cat([prompt, ids], 1)
    mask = torch.cat([pmask, ro.completion_mask], 1).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=full, attention_mask=mask, position_ids=pos).logits.float()
    P = prompt.shape[1]
    ref = logits[:, P - 1 : -1].log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
    cm = ro.completion_mask
    torch.testing.assert_close(ro.sampler_logprobs[cm], ref[cm], atol=1e-4, rtol=0)


def test_min_new_tokens_suppresses_early_eos() -> None:
    model = eos_heavy_model()
    gen = torch.Generator().manual_seed(1)
    ro = TorchRolloutEngine(model).generate(PROMPTS, 4, sampled(20, min_new_tokens=8), gen)
    assert (ro.completion_ids[:, :8] != EOS).all()
    assert (ro.completion_lengths >= 9).all() and not ro.is_truncated.all()
    pinned = TorchRolloutEngine(model).generate(PROMPTS, 2, sampled(10, min_new_tokens=10))
    assert pinned.completion_mask.all() and pinned.is_truncated.all()


def test_lean_stepper_is_chosen_only_where_it_applies() -> None:
    model = tiny_model()
    cache = __import__("transformers").DynamicCache(config=model.config)
    engine = TorchRolloutEngine(model)
    mask = torch.ones(2, 3, dtype=torch.bool)
    with torch.no_grad():
        model.model(input_ids=torch.ones(2, 3, dtype=torch.long), past_key_values=cache, use_cache=True)
    assert isinstance(make_stepper(engine.parts, cache, mask, 4, None), LlamaStepper)
    with engine.parts.packed_weights(4, "all"):  # the head, o and down alone; q/k/v and gate/up stacked
        assert len(engine.parts.packed) == 2 * 2 + 1 and len(engine.parts.fused) == 2 * 2
        rows = sorted(tuple(split) for _, _, split in engine.parts.fused.values())
        assert rows == [(64, 32, 32)] * 2 + [(128, 128)] * 2  # q/k/v (Qwen2: with biases), gate/up
    assert not engine.parts.packed and not engine.parts.fused and not engine.parts.handled
    assert isinstance(make_stepper(engine.parts, cache, mask, 4, False), HFStepper)
    mistral = TorchRolloutEngine(tiny_model(arch="mistral")).parts
    mistral.config.sliding_window = 5  # a window shorter than the sequence: only the HF path is exact
    assert isinstance(make_stepper(mistral, cache, mask, 4, None), HFStepper)
    with pytest.raises(ValueError):
        make_stepper(mistral, cache, mask, 4, True)
    llama = TorchRolloutEngine(tiny_model(arch="llama")).parts
    llama.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert isinstance(make_stepper(llama, cache, mask, 4, None), HFStepper)


@pytest.mark.parametrize("kv", [None, "int8"])
def test_lean_stepper_takes_the_prompt_kv_out_of_the_prefill_cache(kv) -> None:
    """The prompt's keys and values move into the stepper's buffers layer by layer: the prefill cache gives
    each layer up once copied, so a long prompt's KV cache is never held twice (as the trace showed)."""
    from transformers import DynamicCache

    from slimgrpo.rollout.kv_quant import dequantize

    model = tiny_model()
    engine = TorchRolloutEngine(model)
    cache = DynamicCache(config=model.config)
    mask = torch.ones(2, 5, dtype=torch.bool)
    with torch.no_grad():
        model.model(input_ids=torch.arange(10).view(2, 5) + 3, past_key_values=cache, use_cache=True)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    stepper = make_stepper(engine.parts, cache, mask, 4, None, kv_cache_dtype=kv)
    assert all(layer.keys.numel() == 0 and layer.values.numel() == 0 for layer in cache.layers)
    for i, (k, v) in enumerate(before):
        if kv is None:
            assert torch.equal(stepper.keys[i][:, :, :5], k) and torch.equal(stepper.values[i][:, :, :5], v)
        else:
            buf = stepper.keys[i]
            got = dequantize(buf.codes[:, :, :5], buf.scale[:, :, :5], k.dtype)
            torch.testing.assert_close(got, k, atol=0.05 * float(k.abs().max()), rtol=0)


def test_max_batch_rows_chunks_give_the_same_greedy_result() -> None:
    model = tiny_model()
    full = TorchRolloutEngine(model).generate(PROMPTS, 3, greedy(eos=(7, 99)))
    for rows in (1, 2, 5):
        chunked = TorchRolloutEngine(model, max_batch_rows=rows).generate(PROMPTS, 3, greedy(eos=(7, 99)))
        assert torch.equal(chunked.completion_ids, full.completion_ids)
        assert torch.equal(chunked.completion_mask, full.completion_mask)


def test_lora_adapters_are_active_during_generation() -> None:
    peft = pytest.importorskip("peft")
    model = tiny_model()
    base_out = hf_greedy(model, PROMPTS, 10, eos=())
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"])
    lora = peft.get_peft_model(copy.deepcopy(model), config)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    ro = TorchRolloutEngine(lora).generate(PROMPTS, 1, greedy(10, eos=()))
    merged = copy.deepcopy(lora).merge_and_unload()
    assert torch.equal(ro.completion_ids, hf_greedy(merged, PROMPTS, 10, eos=()))
    assert not torch.equal(ro.completion_ids, base_out)


def test_model_mode_is_restored_and_gradient_checkpointing_is_harmless() -> None:
    model = tiny_model()
    expected = TorchRolloutEngine(model).generate(PROMPTS, 2, greedy(eos=())).completion_ids
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    model.train()
    model.model.layers[1].eval()  # a submodule with its own mode must keep it
    ro = TorchRolloutEngine(model).generate(PROMPTS, 2, greedy(eos=()))
    assert torch.equal(ro.completion_ids, expected)
    assert model.training and model.model.layers[0].training and not model.model.layers[1].training
    assert ro.completion_ids.requires_grad is False


def test_generate_rejects_bad_input() -> None:
    engine = TorchRolloutEngine(tiny_model())
    with pytest.raises(ValueError):
        engine.generate([], 2, greedy())
    with pytest.raises(ValueError):
        engine.generate([[1, 2], []], 2, greedy())
    with pytest.raises(ValueError):
        engine.generate(PROMPTS, 0, greedy())
    with pytest.raises(ValueError):
        TorchRolloutEngine(tiny_model(), max_batch_rows=0)
    with pytest.raises(ValueError):
        TorchRolloutEngine(tiny_model(), pack_weights="some")


@pytest.mark.parametrize("pack", ["auto", "all", "head"])  # "none": no LoRA merge, the reference here
def test_lora_merged_for_decoding_matches_unmerged_and_leaves_weights_alone(pack: str, monkeypatch) -> None:
    """The lean stepper decodes LoRA layers through W + scale B A (auto / all): same tokens and log-probs
    as the adapters run beside the base, two active adapters summed, base and adapter weights untouched."""
    peft = pytest.importorskip("peft")
    from slimgrpo.rollout import model_parts

    lora = peft.get_peft_model(tiny_model(), peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    lora.add_adapter("second", peft.LoraConfig(r=3, lora_alpha=3, target_modules=["q_proj", "down_proj"]))
    lora.base_model.set_adapter(["default", "second"])
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)
    before = {k: v.clone() for k, v in lora.state_dict().items()}
    merged_modules = []
    real = model_parts._mergeable
    monkeypatch.setattr(model_parts, "_mergeable", lambda m, target: real(m, target) and not merged_modules.append(m))
    params = SamplingParams(max_new_tokens=10, temperature=1.0, eos_token_ids=(), pad_token_id=PAD)
    ro = TorchRolloutEngine(lora, lean_decode=True, pack_weights=pack).generate(
        PROMPTS, 2, params, torch.Generator().manual_seed(3))
    ref = TorchRolloutEngine(lora, lean_decode=True, pack_weights="none").generate(
        PROMPTS, 2, params, torch.Generator().manual_seed(3))
    assert merged_modules
    assert torch.equal(ro.completion_ids, ref.completion_ids)
    torch.testing.assert_close(ro.sampler_logprobs, ref.sampler_logprobs, rtol=1e-4, atol=1e-4)
    for k, v in lora.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_auto_packing_packs_the_decoder_only_where_its_projections_are_large(monkeypatch) -> None:
    """``pack_weights="auto"``: every projection where the lean stepper decodes and the projections hold at least
    DECODE_PACK_MIN_BYTES (a tiny model's would cost more in oneDNN's kernel cache); else the LM head."""
    from slimgrpo.rollout import engine as engine_mod

    engine = TorchRolloutEngine(tiny_model())
    params = greedy(4)
    assert engine._packing(PROMPTS, params) == "head"
    monkeypatch.setattr(engine_mod, "DECODE_PACK_MIN_BYTES", 0)
    assert engine._packing(PROMPTS, params) == "all"
    assert TorchRolloutEngine(tiny_model(), lean_decode=False)._packing(PROMPTS, params) == "head"
    assert TorchRolloutEngine(tiny_model(), pack_weights="none")._packing(PROMPTS, params) == "none"


@contextlib.contextmanager
def counted_host_syncs(engine):
    """Count what makes the host wait for the device while ``engine`` decodes (``_decode``, not the prefill):
    tensor -> Python conversions (``item``, ``tolist``, ``bool``, ``int``, ``float``, ``cpu``, ...),
    ``nonzero`` and indexing by a boolean mask (its size is only known on the device). ``loop``: the decode
    loop's own; ``step``: inside the stepper's ``step`` (the model)."""
    counts = {"loop": 0, "step": 0, "where": None}
    originals = {}

    def wrap(name):
        original = getattr(torch.Tensor, name)
        originals[name] = original

        def counted(self, *args, **kwargs):
            if counts["where"] is not None:
                index = args[0] if args else None
                parts = index if isinstance(index, tuple) else (index,)
                if not name.startswith("__") or name in ("__bool__", "__int__", "__float__", "__index__") or any(
                        isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts):
                    counts[counts["where"]] += 1
            return original(self, *args, **kwargs)

        setattr(torch.Tensor, name, counted)

    for name in ("item", "tolist", "cpu", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__",
                 "__getitem__", "__setitem__"):
        wrap(name)
    decode = engine._decode

    def decoding(stepper, *args, **kwargs):
        step = stepper.step

        def stepping(tokens):
            counts["where"] = "step"
            try:
                return step(tokens)
            finally:
                counts["where"] = "loop"

        stepper.step = stepping
        counts["where"] = "loop"
        try:
            return decode(stepper, *args, **kwargs)
        finally:
            counts["where"] = None

    engine._decode = decoding
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@pytest.mark.parametrize("lean", [True, False])
def test_decode_waits_for_the_device_once_per_step(lean) -> None:
    """Issue 42: the loop asked the device three times a step (any / all / sum); once now (how many rows are
    done), none without EOS, and none more when rows leave the batch. The lean step itself asks nothing (the
    model's own forward, ``lean=False``, is Hugging Face's business)."""
    model = tiny_model()
    free = hf_greedy(model, PROMPTS, 12, eos=())
    params = greedy(12, eos=(int(free[0, 2]), int(free[2, 6])))
    engine = TorchRolloutEngine(model, drop_finished_fraction=0.0, lean_decode=lean)
    with counted_host_syncs(engine) as counts:
        ro = engine.generate(PROMPTS, 2, params)
    steps = int(ro.completion_lengths.max())  # sampling steps taken: the last one asks nothing
    assert ro.completion_lengths.min() < steps  # rows did leave the batch
    assert 0 < counts["loop"] <= steps - 1, (counts, steps)
    if lean:
        assert counts["step"] == 0
    with counted_host_syncs(engine) as counts:
        engine.generate(PROMPTS, 2, greedy(12, eos=()))
    assert counts["loop"] == 0
