"""Memory planner: shapes, closed-form arithmetic, component rules, budget fitting, rendering."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
import torch

from slimgrpo.plan.search import fit_to_budget, suggest_fixes
from slimgrpo.units import parse_bytes
from slimgrpo.plan.render import render_plan
from slimgrpo.memory.footprint import CPU_FRAMEWORK_OVERHEAD_BYTES, CUDA_FRAMEWORK_OVERHEAD_BYTES
from slimgrpo.runspec.cost import GiB
from slimgrpo.runspec.cost import LORA_ADAPTER_BYTES, kv_cache_bytes, logits_bytes, lora_num_params
from slimgrpo.runspec.run import RunSpec
from slimgrpo.forward.costs import activation_bytes_per_token_layer, attention_mask_bytes
from slimgrpo.plan.model import plan_memory
from slimgrpo.memory.footprint import TOKENIZER_BYTES_PER_VOCAB, cpu_runtime_bytes
from slimgrpo.runspec.shape import ModelShape, load_shape, preset_shapes

LLAMA_8B = load_shape("llama-3.1-8b")
QWEN_05B = load_shape("qwen2.5-0.5b")

# Unsloth's long-context GRPO example: Llama-3.1-8B, 8 generations, 20K (20,480-token) context.
UNSLOTH_TOKENS = 20_480


# ---------------------------------------------------------------------------------------------
# shapes
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, published",
    [("qwen2.5-0.5b", 494e6), ("qwen2.5-1.5b", 1.54e9), ("llama-3.2-1b", 1.24e9), ("llama-3.1-8b", 8.03e9)],
)
def test_num_params_matches_published_counts(name, published):
    assert load_shape(name).num_params == pytest.approx(published, rel=0.01)


def _tiny_config(family: str, tie: bool):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[family]
    return cls(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=300, tie_word_embeddings=tie, head_dim=16)


@pytest.mark.parametrize("family", ["qwen2", "llama", "qwen3", "mistral"])
@pytest.mark.parametrize("tie", [True, False])
def test_num_params_equals_hf_model(family, tie):
    from transformers import AutoModelForCausalLM

    config = _tiny_config(family, tie)
    model = AutoModelForCausalLM.from_config(config)
    shape = ModelShape.from_hf_config(config.to_dict())
    assert shape.family == family and shape.tie == tie
    assert shape.num_params == sum(p.numel() for p in model.parameters())


@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft calls a deprecated transformers helper
def test_lora_num_params_equals_peft():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    config = _tiny_config("qwen2", tie=True)
    shape = ModelShape.from_hf_config(config.to_dict())
    for targets in (("all-linear",), ("q_proj", "v_proj")):
        model = AutoModelForCausalLM.from_config(config)
        peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=list(targets) if len(targets) > 1
                                                      else targets[0]))
        trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
        assert lora_num_params(shape, 4, targets) == trainable


def _saved_bytes_per_token(dtype, lora: bool, m: int = 2, S: int = 64, padded: bool = True,
                           family: str = "qwen2") -> float:
    """Bytes autograd keeps for the second decoder layer (parameters and shared cos/sin excluded)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config_cls, model_cls = (Qwen3Config, Qwen3ForCausalLM) if family == "qwen3" else (Qwen2Config, Qwen2ForCausalLM)
    config = config_cls(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=8,
                        num_key_value_heads=2, vocab_size=128, attn_implementation="sdpa", head_dim=8)
    model = model_cls(config).to(dtype).train()
    if lora:
        from peft import LoraConfig, get_peft_model

        from slimgrpo.modeling import adapters_in_input_dtype

        model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", lora_dropout=0.0))
        adapters_in_input_dtype(model)  # as modeling.apply_lora leaves a run's model
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    cast_shapes = {s for p in model.parameters() if p.dtype != dtype  # fp32 adapters, as saved or transposed
                   for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    seen: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        # cos/sin are [1, S, d], shared; an adapter weight cast to bf16 per call is not per token
        if storage.data_ptr() not in params and t.shape[0] != 1 and tuple(t.shape) not in cast_shapes:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    layer = model.get_decoder().layers[1]
    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    layer.register_forward_pre_hook(lambda *a: hooks.__enter__())
    layer.register_forward_hook(lambda *a: hooks.__exit__(None, None, None))
    mask = torch.ones(m, S, dtype=torch.long)
    mask[0, :3] = 0  # left padding: Hugging Face builds an attention mask
    model(input_ids=torch.randint(0, 128, (m, S)), attention_mask=mask if padded else None)
    return sum(seen.values()) / (m * S)


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("dtype, lora", [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)])
@pytest.mark.parametrize("device", ["cpu", "cuda"])  # cuda: HF's rule there (a mask repeats K/V), run on CPU
def test_activation_formula_matches_autograd(dtype, lora, padded, device):
    from slimgrpo.memory.attention import cpu_gqa

    config = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 128}
    shape = ModelShape.from_hf_config(config)
    inputs = RunSpec(device=device, param_dtype_bytes=dtype.itemsize, lora=lora, lora_rank=4)
    S = 64
    _, mask_per_layer = attention_mask_bytes(inputs, 2, S, padded=padded)
    predicted = activation_bytes_per_token_layer(shape, inputs, padded=padded) + mask_per_layer / (2 * S)
    with cpu_gqa(device):
        assert _saved_bytes_per_token(dtype, lora, S=S, padded=padded) == predicted
    if not padded:
        assert mask_per_layer == 0


@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.parametrize("lora", [False, True])
def test_activation_formula_matches_autograd_with_qk_norm(lora):
    """Qwen3's RMSNorm on every head of q and k keeps its fp32 upcast and rsqrt (and, full fine-tuning, the
    normalised q / k for the norm weights' gradient): the formula's qk_norm term, byte for byte."""
    from slimgrpo.memory.attention import cpu_gqa

    config = {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
              "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 128, "head_dim": 8}
    shape = ModelShape.from_hf_config(config)
    inputs = RunSpec(device="cuda", param_dtype_bytes=2, lora=lora, lora_rank=4)
    predicted = activation_bytes_per_token_layer(shape, inputs, padded=False)
    plain = activation_bytes_per_token_layer(dataclasses.replace(shape, family="llama"), inputs, padded=False)
    assert predicted - plain == 4 * (64 + 16) + 4 * (8 + 2) + (0 if lora else 2 * (64 + 16))
    with cpu_gqa("cuda"):
        assert _saved_bytes_per_token(torch.bfloat16, lora, padded=False, family="qwen3") == predicted


def test_load_shape_presets_ids_and_typos():
    assert load_shape("Qwen2.5-0.5B") == QWEN_05B
    assert load_shape("Qwen/Qwen2.5-0.5B-Instruct") == QWEN_05B
    assert load_shape("meta-llama/Llama-3.1-8B-Instruct") == LLAMA_8B
    assert LLAMA_8B.head_dim == 128 and LLAMA_8B.kv_dim == 1024
    assert set(preset_shapes()) >= {"qwen2.5-0.5b", "llama-3.1-8b"}
    with pytest.raises(ValueError, match="qwen2.5-0.5b"):
        load_shape("qwen2.5-05b")
    with pytest.raises(ValueError, match="Presets"):
        load_shape("gpt-17")


def test_load_shape_from_file_and_folder(tmp_path):
    config = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "tie_word_embeddings": False, "max_position_embeddings": 131072}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_shape(tmp_path) == LLAMA_8B
    assert load_shape(str(tmp_path / "config.json")) == LLAMA_8B
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        load_shape(empty)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_shape(tmp_path / "bad.json")
    (tmp_path / "bert.json").write_text(json.dumps({**config, "model_type": "bert"}))
    with pytest.raises(ValueError, match="bert"):
        load_shape(tmp_path / "bert.json")


# ---------------------------------------------------------------------------------------------
# published arithmetic
# ---------------------------------------------------------------------------------------------
def test_logits_arithmetic_78_gib():
    b = logits_bytes(rows=8, tokens=UNSLOTH_TOKENS, vocab=128_256, dtype_bytes=2, copies=2)
    assert b == 84_053_852_160
    assert round(b / GiB, 1) == 78.3


def test_kv_cache_arithmetic_2_5_gib():
    b = kv_cache_bytes(layers=32, tokens=UNSLOTH_TOKENS, kv_heads=8, head_dim=128, rows=1, dtype_bytes=2)
    assert b == 2.5 * GiB


def test_plan_kv_cache_uses_helper():
    x = RunSpec(num_generations=8, max_prompt_length=100, max_completion_length=400, generation_batch_rows=4)
    plan = plan_memory(LLAMA_8B, x)
    assert plan.bytes_of("KV cache") == kv_cache_bytes(32, 500, 8, 128, rows=4, dtype_bytes=2)


# ---------------------------------------------------------------------------------------------
# component rules
# ---------------------------------------------------------------------------------------------
def test_lora_cuts_gradients_and_optimizer_to_adapters():
    # two micro-batches: every gradient alive through backward (planner._gradients_in_backward)
    full = plan_memory(LLAMA_8B, RunSpec(micro_batch_rows=4))
    lora = plan_memory(LLAMA_8B, RunSpec(lora=True, lora_rank=16, micro_batch_rows=4))
    n = lora_num_params(LLAMA_8B, 16, ("all-linear",))
    assert n == 32 * 16 * (3 * (4096 + 14336) + 2 * (4096 + 4096) + 2 * (4096 + 1024))
    assert full.bytes_of("gradients") == LLAMA_8B.num_params * 2
    assert lora.bytes_of("gradients") == n * LORA_ADAPTER_BYTES
    assert lora.bytes_of("optimizer state") == n * LORA_ADAPTER_BYTES * 2
    assert lora.bytes_of("weights") == full.bytes_of("weights")
    qlora = plan_memory(LLAMA_8B, RunSpec(lora=True, load_in_4bit=True))
    # NF4 projections (4.127 bits) plus bf16 embedding and head: about 5.7 GB for Llama-3.1-8B.
    assert 0.3 < qlora.bytes_of("weights") / full.bytes_of("weights") < 0.4


def test_beta_zero_removes_the_reference():
    cuda = plan_memory(LLAMA_8B, RunSpec(beta=0.04))
    assert cuda.bytes_of("reference policy") == LLAMA_8B.num_params * 2
    assert cuda.host_bytes == LLAMA_8B.num_params * 2  # kept in host RAM, not on the GPU
    assert plan_memory(LLAMA_8B, RunSpec(beta=0.0)).bytes_of("reference policy") == 0
    assert plan_memory(LLAMA_8B, RunSpec(beta=0.04, lora=True)).bytes_of("reference policy") == 0
    cpu_ref = plan_memory(QWEN_05B, RunSpec(device="cpu", beta=0.04))
    cpu_none = plan_memory(QWEN_05B, RunSpec(device="cpu", beta=0.0))
    assert cpu_ref.peak_bytes - cpu_none.peak_bytes >= QWEN_05B.num_params * 2  # counts in RSS on cpu
    assert cpu_ref.host_bytes == 0


def test_checkpointing_and_offload_reduce_device_activations():
    base = RunSpec(num_generations=8, max_completion_length=4096, micro_batch_rows=4)
    plain = plan_memory(LLAMA_8B, base).bytes_of("activations")
    ckpt_inputs = dataclasses.replace(base, gradient_checkpointing=True)
    ckpt = plan_memory(LLAMA_8B, ckpt_inputs).bytes_of("activations")
    offload = plan_memory(LLAMA_8B, dataclasses.replace(ckpt_inputs, offload_activations=True))
    assert ckpt < plain / 5
    assert offload.bytes_of("activations") < ckpt
    tokens = 4 * (512 + 4096)
    # L·m·S·H·B checkpoints, the final norm's fp32 input and output m·S·(4 + B)·H, and what the fused loss saves:
    # the hidden gradient m·T·H·4 and the trained head's gradient V·H·4 (formulas.offloaded_bytes; the rsqrt and
    # the ids are under offload's 1 MiB minimum)
    assert offload.host_bytes == 32 * tokens * 4096 * 2 + tokens * (4 + 2) * 4096 + 4 * 4096 * 4096 * 4 + \
        LLAMA_8B.vocab * 4096 * 4
    with pytest.raises(ValueError, match="gradient_checkpointing"):
        dataclasses.replace(base, offload_activations=True)


def test_chunked_loss_versus_full_logits():
    x = RunSpec(lora=True, max_completion_length=2048, micro_batch_rows=4, token_chunk=512)
    full = plan_memory(QWEN_05B, dataclasses.replace(x, chunked_loss=False)).bytes_of("loss working set")
    chunked = plan_memory(QWEN_05B, x).bytes_of("loss working set")
    assert full >= logits_bytes(4, 2048, QWEN_05B.vocab, 2, 2)
    assert chunked < full / 3  # 2.5 fp32-sized [token_chunk, vocab] blocks (fused, bf16) + the hidden states (traced)
    # Full fine-tuning adds the chunked head's fp32 gradient accumulator for the [V, H] head, and in bf16 its
    # per-slice product, formed in bf16 and widened to fp32 (chunked_head._backprop_slice).
    full_ft = plan_memory(QWEN_05B, dataclasses.replace(x, lora=False)).bytes_of("loss working set")
    assert full_ft - chunked == QWEN_05B.vocab * QWEN_05B.hidden * (4 + 2 + 4)


def test_peak_is_always_plus_the_larger_phase():
    for x in (RunSpec(), RunSpec(device="cpu", param_dtype_bytes=4), RunSpec(num_generations=64)):
        plan = plan_memory(QWEN_05B, x)
        t = plan.phase_totals
        assert plan.peak_bytes == t["always"] + max(t["generation"], t["update"])
        assert plan.peak_phase == max(("generation", "update"), key=lambda p: (t[p], p == "update"))
    cpu = plan_memory(QWEN_05B, RunSpec(device="cpu"))
    runtime = CPU_FRAMEWORK_OVERHEAD_BYTES + TOKENIZER_BYTES_PER_VOCAB * QWEN_05B.vocab  # imports + the tokenizer
    assert cpu.framework_bytes == runtime == cpu_runtime_bytes(QWEN_05B.vocab)
    assert cpu.bytes_of("tokenizer") == 1_000 * 151_936  # about 1 KB an entry: Qwen2's measured 152 MiB
    assert cpu.tensor_peak_bytes == cpu.peak_bytes - runtime
    cuda = plan_memory(QWEN_05B, RunSpec())
    assert "tokenizer" not in {c.name for c in cuda.components}
    assert cuda.framework_bytes == CUDA_FRAMEWORK_OVERHEAD_BYTES


def test_micro_batches_bound_update_memory_but_not_generation():
    small = plan_memory(LLAMA_8B, RunSpec(num_generations=16, micro_batch_rows=2, share_prompt_forward=False))
    large = plan_memory(LLAMA_8B, RunSpec(num_generations=16, micro_batch_rows=16, share_prompt_forward=False))
    assert small.bytes_of("activations") < large.bytes_of("activations") / 6
    assert small.phase_total("update") < large.phase_total("update")
    assert small.phase_total("generation") == large.phase_total("generation")


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(device="tpu"), "device"),
        (dict(param_dtype_bytes=3), "param_dtype_bytes"),
        (dict(optimizer="sgd"), "optimizer"),
        (dict(num_generations=0), "num_generations"),
        (dict(lora_target_modules=("qkv",)), "lora_target_modules"),
        (dict(load_in_4bit=True), "lora=True"),
        (dict(load_in_4bit=True, lora=True, device="cpu"), "CUDA"),
        (dict(beta=-1.0), "beta"),
        (dict(vocab_chunk=0), "vocab_chunk"),
    ],
)
def test_plan_inputs_reject_bad_values(bad, match):
    with pytest.raises(ValueError, match=match):
        RunSpec(**bad)


# ---------------------------------------------------------------------------------------------
# the Unsloth / TRL rows of the brief (Llama-3.1-8B, 20K context, 8 generations)
# ---------------------------------------------------------------------------------------------
def test_explains_unsloth_and_trl_rows():
    trl_like = RunSpec(device="cuda", lora=True, num_generations=8, max_prompt_length=1,
                          max_completion_length=UNSLOTH_TOKENS, micro_batch_rows=8, chunked_loss=False,
                          gradient_checkpointing=True)
    plan = plan_memory(LLAMA_8B, trl_like)
    per_token = 12 * 8 * UNSLOTH_TOKENS * 4  # the objective's own [rows, T] fp32 tensors
    # "GRPO memory cost 78.3 GB": full logits and their gradient, 8 rows at once.
    assert plan.bytes_of("loss working set") - per_token == logits_bytes(8, UNSLOTH_TOKENS, 128_256, 2, 2)
    # Unsloth's 9.8 GB is the same full-logits formula for one row at a time (78.3 / 8).
    one_row = plan_memory(LLAMA_8B, dataclasses.replace(trl_like, micro_batch_rows=1))
    assert round((one_row.bytes_of("loss working set") - per_token / 8) / GiB, 1) == 9.8
    # slimgrpo's chunked head is smaller still (a quarter of it: four fp32 blocks of a bf16 head, as traced, and
    # the row's fp32 hidden gradient).
    chunked = plan_memory(LLAMA_8B, dataclasses.replace(trl_like, micro_batch_rows=1, chunked_loss=True))
    assert chunked.bytes_of("loss working set") < 9.8 * GiB / 4
    # "Inference cost 16 GB": a second bf16 copy of the weights (8.03e9 · 2 B), which we never make.
    assert round(plan.bytes_of("weights") / 1e9) == 16
    # "KV cache 2.5 GB" matches one 20K-token sequence; 8 rows of 20K hold 8 times that.
    assert plan.bytes_of("KV cache") == kv_cache_bytes(32, UNSLOTH_TOKENS + 1, 8, 128, rows=8)
    # "Training 42 GB": the checkpointed layer inputs of 8 rows × 20K in bf16 (which Unsloth
    # offloads), L·m·S·H·B = 42.9e9 B.
    offloaded = plan_memory(LLAMA_8B, dataclasses.replace(trl_like, offload_activations=True))
    tokens = 8 * (UNSLOTH_TOKENS + 1)
    # (with the final norm's fp32 input and output, tokens·(4 + B)·H, and the int64 input ids, over 1 MiB here)
    assert offloaded.bytes_of("offloaded checkpoints") == 32 * tokens * 4096 * 2 + tokens * (6 * 4096 + 8)
    assert round(offloaded.host_bytes / 1e9) == 47


# ---------------------------------------------------------------------------------------------
# budget fitting
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, expected",
    [("16GiB", 16 * 2**30), ("16GB", 16 * 10**9), ("16 gb", 16 * 10**9), ("16000MiB", 16000 * 2**20),
     ("1.5TiB", int(1.5 * 2**40)), ("123456", 123456), (123456, 123456), ("512kB", 512_000), ("0", 0)],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("junk", ["", "GiB", "16 apples", "16G", "-3GB", "1e3GB", -1, True, 3.5, None])
def test_parse_bytes_rejects_junk(junk):
    with pytest.raises(ValueError):
        parse_bytes(junk)


UNSLOTH_NAIVE = RunSpec(device="cuda", num_generations=8, max_prompt_length=256,
                           max_completion_length=UNSLOTH_TOKENS, micro_batch_rows=8, chunked_loss=False, beta=0.04)


def test_fit_llama_8b_20k_on_80_gib():
    assert plan_memory(LLAMA_8B, UNSLOTH_NAIVE).peak_bytes > 1000 * GiB
    final, steps, fits = fit_to_budget(LLAMA_8B, UNSLOTH_NAIVE, "80GiB")
    assert fits
    assert final.lora and final.gradient_checkpointing and final.offload_activations and final.chunked_loss
    assert not final.load_in_4bit and final.max_completion_length == UNSLOTH_TOKENS  # cheaper fixes sufficed
    assert plan_memory(LLAMA_8B, final).peak_bytes <= 80 * GiB
    assert steps[-1].plan_after.peak_bytes == plan_memory(LLAMA_8B, final).peak_bytes
    peaks = [s.plan_after.peak_bytes for s in steps]
    assert peaks == sorted(peaks, reverse=True)
    assert all(set(s.change) <= {f.name for f in dataclasses.fields(RunSpec)} for s in steps)


def test_fit_reports_infeasible_budget():
    final, steps, fits = fit_to_budget(LLAMA_8B, UNSLOTH_NAIVE, "1GiB")
    assert not fits and steps
    assert final.load_in_4bit  # it tried everything the ladder has
    assert steps[-1].plan_after.peak_bytes > GiB


def test_no_suggestions_when_it_fits():
    assert suggest_fixes(QWEN_05B, RunSpec(lora=True), "80GiB") == []
    final, steps, fits = fit_to_budget(QWEN_05B, RunSpec(lora=True), 80 * GiB)
    assert fits and steps == [] and final == RunSpec(lora=True)


def test_render_plan_shows_table_and_verdict():
    from rich.console import Console

    console = Console(file=io.StringIO(), width=160, record=True)
    plan = plan_memory(LLAMA_8B, dataclasses.replace(UNSLOTH_NAIVE, chunked_loss=True))
    render_plan(plan, console=console, budget_bytes="80GiB")
    text = console.export_text()
    for word in ("KV cache", "loss working set", "peak", "over by", "no mask"):
        assert word in text
        assert word in text
    render_plan(plan_memory(QWEN_05B, RunSpec(lora=True)), console=console, budget_bytes=80 * GiB)
    assert "fits" in console.export_text()
