"""Load the policy: a Hugging Face causal LM from a folder, its tokenizer, LoRA through peft, and the
reference policy without a second copy of the weights where that is possible."""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from slimgrpo.config import Config, LoraConfig, ModelConfig
from slimgrpo.causal_lm import is_peft, unwrap_causal_lm
from slimgrpo.config.context import position_limit
from slimgrpo.memory.pinned import HostBuffer, page_aligned_empty
from slimgrpo.model_gguf import GGUFError, gguf_config, is_gguf, load_gguf_model, load_gguf_tokenizer

log = logging.getLogger("slimgrpo")


CRITIC_ADAPTER = "critic"  # the peft adapter of PPO's LoRA critic (update/critic.py); not the policy's


class ModelLoadError(ValueError):
    """The model folder is missing, incomplete, or cannot be loaded."""


def _gguf_call(fn, *args, **kwargs):
    """A GGUF reader with its errors as ``ModelLoadError`` (exit 2, naming the file)."""
    try:
        return fn(*args, **kwargs)
    except GGUFError as e:
        raise ModelLoadError(str(e)) from None


WEIGHT_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "pytorch_model*.bin")


def read_model_config(path: str) -> dict[str, Any]:
    """config.json of a local model folder, or the same read from a GGUF file's metadata (cheap: no
    weights are read)."""
    if is_gguf(path):
        return _gguf_call(gguf_config, path)
    p = Path(path)
    if not p.exists():
        raise ModelLoadError(
            f"model folder {path!r} does not exist. model.path must be a local folder holding "
            "config.json and the weights (e.g. saved with save_pretrained)."
        )
    if p.is_file():
        raise ModelLoadError(
            f"model.path {path!r} is a file; point it at the model folder that holds config.json and the "
            f"weights (perhaps model.path={str(p.parent)!r}), or at a .gguf file")
    cfg_file = p / "config.json"
    if not cfg_file.is_file():
        raise ModelLoadError(f"model folder {path!r} has no config.json; is it a Hugging Face model folder?")
    try:
        return json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{cfg_file}: not valid JSON ({e.msg}, line {e.lineno})") from None


def looks_like_hub_name(path: str) -> bool:
    """``org/name`` that is not a local path (only then may transformers try the hub); a name ending in a file
    suffix (``.gguf``, ``.jsonl``) is a path (config/paths.py's rule)."""
    from slimgrpo.config.paths import looks_like_hub_name as hub_like

    return not os.path.exists(path) and hub_like(path)


def max_positions(model_config: dict[str, Any]) -> int | None:
    """The model's position limit after its rope scaling (``config/context.py``), None when unknown."""
    return position_limit(model_config)[0]


def check_weights_present(path: str) -> None:
    p = Path(path)
    if not any(any(p.glob(pat)) for pat in WEIGHT_PATTERNS):
        raise ModelLoadError(
            f"model folder {path!r} has a config.json but no weights (*.safetensors or pytorch_model.bin)"
        )
    check_weights_readable(p)


def check_weights_readable(folder: Path) -> None:
    """Every safetensors file's header and size read correctly (a truncated or corrupt download names
    its file instead of failing deep inside transformers)."""
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt"):
                pass
        except Exception as e:  # SafetensorError (header/size), OSError
            raise ModelLoadError(
                f"{f} cannot be read ({type(e).__name__}: {e}): the file is truncated or corrupt. Copy or "
                "download the model again, or re-save it with save_pretrained.") from None


def resolve_device(name: str) -> torch.device:
    """``run.device`` as a device with an index on CUDA: ``cuda:N`` as given, ``auto`` / ``cuda`` the current
    device, which under torchrun is the rank's own (``process_group.init_process_group`` sets it from LOCAL_RANK
    before anything loads). Code that reads ``device.index`` (4-bit loading's ``device_map``, DDP's
    ``device_ids``) then never falls back to GPU 0 on every rank."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(name)
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise ModelLoadError(f"run.device={name!r} but no CUDA device is available; use run.device=cpu")
    count = torch.cuda.device_count()
    if dev.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if dev.index >= count:
        raise ModelLoadError(f"run.device={name!r} but this machine has {count} CUDA device(s) "
                             f"(cuda:0 to cuda:{count - 1}); use one of those or run.device=auto")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """Tokenizer of a folder. A folder with tokenizer.json loads as PreTrainedTokenizerFast, so a
    config.json saying e.g. ``qwen2`` cannot make transformers rebuild a different tokenizer."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    p = Path(path)
    if is_gguf(path):
        return _finish_tokenizer(_gguf_call(load_gguf_tokenizer, path), path)
    if not p.exists() and not looks_like_hub_name(path):  # fail at once instead of asking the hub
        raise ModelLoadError(f"tokenizer folder {path!r} does not exist: set model.tokenizer_path to a local "
                             "folder with tokenizer.json (or leave it empty to use model.path)")
    try:
        if (p / "tokenizer.json").is_file():
            tok = PreTrainedTokenizerFast.from_pretrained(path)
        else:
            tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ModelLoadError(f"could not load a tokenizer from {path!r}: {type(e).__name__}: {e}") from None
    return _finish_tokenizer(tok, path)


def _finish_tokenizer(tok, path: str):
    """EOS required, padding on the left (EOS as padding when there is no pad token)."""
    if tok.eos_token_id is None:
        raise ModelLoadError(f"the tokenizer in {path!r} has no eos_token: completions could never end")
    if tok.pad_token_id is None:
        # Masks are explicit everywhere, so using EOS as padding is safe.
        tok.pad_token = tok.eos_token
        log.info("tokenizer has no pad token; using eos %r for padding", tok.eos_token)
    tok.padding_side = "left"
    return tok


def load_model(cfg: ModelConfig, device: torch.device, dtype: torch.dtype):
    """The causal LM on ``device``; weights read from safetensors (no pickle)."""
    from transformers import AutoModelForCausalLM

    path = cfg.path
    kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    if cfg.load_in_4bit:
        if device.type != "cuda":
            raise ModelLoadError("model.load_in_4bit (QLoRA) needs a CUDA device (bitsandbytes 4-bit)")
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=True,
        )
        # The rank's own GPU (resolve_device always gives CUDA devices an index): never every rank on GPU 0.
        kwargs["device_map"] = {"": device.index if device.index is not None else torch.cuda.current_device()}
    if is_gguf(path):
        if cfg.load_in_4bit:
            raise ModelLoadError(f"model.load_in_4bit with a GGUF file ({path}): convert it to a Hugging Face "
                                 "folder first (scripts/get_smollm2.py shows how) and quantise that")
        model = _gguf_call(load_gguf_model, path, dtype, **{k: v for k, v in kwargs.items() if k != "dtype"})
        return model.to(device)
    if os.path.isdir(path):
        check_weights_present(path)
        # Never unpickle a .bin the user did not explicitly accept: prefer safetensors.
        kwargs["use_safetensors"] = any(Path(path).glob("*.safetensors"))
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
        except ValueError as e:
            if kwargs.get("attn_implementation") != "sdpa" or "scaled_dot_product_attention" not in str(e):
                raise
            # An architecture without SDPA support (GPT-OSS: attention sinks): transformers' own choice instead.
            log.warning("model %s has no SDPA attention (model.attn_implementation=sdpa); loading it with "
                        "transformers' default attention implementation", path)
            model = AutoModelForCausalLM.from_pretrained(path, **{k: v for k, v in kwargs.items()
                                                                  if k != "attn_implementation"})
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"could not load the model from {path!r}: {type(e).__name__}: {e}") from None
    if not cfg.load_in_4bit:
        model.to(device)
    return model


def apply_lora(model, cfg: LoraConfig, quantized: bool = False):
    """peft LoRA adapters on ``model`` (fp32 adapters: peft's default), computed in the activations' dtype
    (:func:`adapters_in_input_dtype`). A 4-bit base (``quantized``) is frozen first and otherwise left as
    loaded: see :func:`prepare_quantized_base`."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    if quantized:
        model = prepare_quantized_base(model)
    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
        target_modules=cfg.target_modules, task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, peft_cfg)
    adapters_in_input_dtype(model)
    return model


class InputDtypeLinear(torch.nn.Linear):
    """A LoRA factor (``lora_A`` / ``lora_B``) that keeps its fp32 weight and multiplies in its input's dtype.

    peft casts a layer's input to the adapter's dtype before ``lora_A``: with a bf16 model and fp32 adapters
    that is a new fp32 copy of the input per adapted projection (q, k and v each make one of the same
    hidden states), and autograd keeps every copy for ``lora_A``'s weight gradient, 2x the bytes of the
    bf16 tensor the layer already holds. Here the input is left alone and the (small) weight is cast per call
    instead, as autocast would: the product runs in the compute dtype, the gradient reaches the fp32 weight
    through the cast, and q / k / v's adapters keep one shared input. With an fp32 input nothing changes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.weight, self.bias
        if weight.dtype != x.dtype:
            weight = weight.to(x.dtype)
            bias = None if bias is None else bias.to(x.dtype)
        return torch.nn.functional.linear(x, weight, bias)


def adapters_in_input_dtype(model) -> int:
    """Every plain LoRA factor of ``model`` becomes an :class:`InputDtypeLinear` (the same parameters, so
    state dicts, saving and merging are unchanged) and peft's input cast is turned off on its layer. Call it
    again after ``add_adapter``. Returns how many factors were switched."""
    from peft.tuners.lora import LoraLayer

    switched = 0
    for module in model.modules():
        if not isinstance(module, LoraLayer):
            continue
        module.cast_input_dtype_enabled = False
        for factors in (module.lora_A, module.lora_B):
            for factor in factors.values():
                if type(factor) is torch.nn.Linear:
                    factor.__class__ = InputDtypeLinear
                    switched += 1
    return switched


def prepare_quantized_base(model):
    """Freeze a 4-bit (QLoRA) base for LoRA training, keeping its non-quantised tensors in the compute dtype.

    peft's ``prepare_model_for_kbit_training`` also casts every bf16 / fp16 parameter that is not 4-bit
    (embedding, LM head, norms) to fp32: the norms' fp32 weights then make the residual stream fp32, so every
    activation and checkpoint of the update is twice the size (the trace of Qwen3-8B QLoRA held 1.36-1.42x
    the plan). Here only the freezing is kept; the embedding, head and norms stay in the model's dtype
    and only the LoRA adapters (and their optimizer state) are fp32. What that function does besides, for
    gradient checkpointing (inputs that require grad so a checkpointed block has a gradient path), is done
    by :func:`prepare_for_training` for every LoRA model."""
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def generation_eos_ids(model) -> list[int]:
    """The end-of-sequence ids of the model's generation_config (none, one or several)."""
    eos = getattr(getattr(unwrap_causal_lm(model), "generation_config", None), "eos_token_id", None)
    if eos is None:
        return []
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


@dataclass
class Policy:
    """The trained model and how to evaluate the reference policy without a second copy."""

    model: Any  # transformers PreTrainedModel or peft PeftModel
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    # Full fine-tuning with beta > 0: the frozen copy (:func:`reference_copy`), in host memory, or on the
    # device when ``reference_placement`` is "device". The name is older than the device placement.
    reference_cpu: Any = None
    reference_placement: str = "host"  # "host" | "stream" | "device": memory.reference_placement, resolved

    @contextlib.contextmanager
    def reference(self, sharded_root: Any = None) -> Iterator[Any]:
        """Yield a module computing the reference policy's outputs.

        LoRA: the same model with adapters disabled (``sharded_root``: the FSDP2 root it must run through
        when its weights are sharded). Full fine-tuning: the initial weights as held (``reference_placement``):
        on the device, or in host memory; a "stream" copy is run on the device by the update stage, which
        moves its layers in one by one (``update/reference.py``); the planner counts each placement."""
        if is_peft(self.model):
            with self.model.disable_adapter():
                yield self.model if sharded_root is None else sharded_root
        elif self.reference_cpu is not None:
            yield self.reference_cpu
        else:
            raise RuntimeError("no reference policy: loss.beta is 0")

    @torch.no_grad()
    def sync_reference(self, alpha: float) -> None:
        """TR-DPO (arXiv:2404.09656): ``ref = alpha * policy + (1 - alpha) * ref``, parameter by parameter
        (full fine-tuning; a sharded FSDP2 parameter is gathered first, on every rank)."""
        if self.reference_cpu is None:
            raise RuntimeError("sync_reference needs the full-fine-tuning reference copy (loss.beta > 0, no LoRA)")
        ref = dict(self.reference_cpu.named_parameters())
        for name, p in unwrap_causal_lm(self.model).named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            r = ref[name]
            r.mul_(1.0 - alpha).add_(full.detach().to(r.device, r.dtype), alpha=alpha)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """The policy's trainable parameters (PPO's critic adapter, ``CRITIC_ADAPTER``, is not one)."""
        return [p for n, p in self.model.named_parameters() if p.requires_grad and f".{CRITIC_ADAPTER}." not in n]


def tokenizer_folder(cfg: Config) -> str:
    """The run's tokenizer folder: ``model.tokenizer_path``, else the model's."""
    from slimgrpo.config import resolve_path

    return resolve_path(cfg, cfg.model.tokenizer_path or cfg.model.path)


def load_run_tokenizer(cfg: Config):
    """The run's tokenizer (:func:`tokenizer_folder`), as training, ``slimgrpo plan`` and the benchmarks load it."""
    return load_tokenizer(tokenizer_folder(cfg), cfg.model.trust_remote_code)


def build_policy(cfg: Config, tokenizer=None) -> Policy:
    """The policy of ``cfg``: its model on the run's device, prepared for training, and its tokenizer
    (``tokenizer``, when the caller loaded it already, else ``model.tokenizer_path`` or the model's folder)."""
    device = resolve_device(cfg.run.device)
    dtype = resolve_dtype(cfg.model.dtype, device)
    from slimgrpo.config import resolve_path

    model_path = resolve_path(cfg, cfg.model.path)
    if tokenizer is None:
        tokenizer = load_run_tokenizer(cfg)
    mcfg = ModelConfig(**{**cfg.model.__dict__, "path": model_path})
    # FSDP2 under torchrun: read the weights into host memory; fully_shard then moves only this rank's
    # shard to the accelerator, so weights that do not fit one device can still be loaded.
    sharded = cfg.distributed.strategy == "fsdp" and int(os.environ.get("WORLD_SIZE", "1")) > 1
    model = load_model(mcfg, torch.device("cpu") if sharded else device, dtype)
    model.config.pad_token_id = tokenizer.pad_token_id
    placement = reference_placement(cfg, device)
    model, reference_cpu = prepare_for_training(model, cfg, device if placement == "device" else None)
    return Policy(model, tokenizer, device, dtype, reference_cpu, placement)


def policy_of(model: torch.nn.Module, tokenizer, cfg: Config) -> Policy:
    """The policy of a model the caller loaded (TRL's ``GRPOTrainer(model=...)``): a causal LM, or one already
    wrapped with LoRA adapters (a ``PeftModel``: its adapters are the ones trained, ``cfg.lora.enabled`` must say
    so), moved to the run's device in the dtype it was loaded in and prepared as ``build_policy`` prepares one.
    The caller's model object is the one trained."""
    device = resolve_device(cfg.run.device)
    dtype = next(model.parameters()).dtype
    if is_peft(model) and not cfg.lora.enabled:
        raise ValueError("the model carries LoRA adapters (a peft model): train it with lora.enabled=true")
    model.to(device)
    if tokenizer.pad_token_id is not None:
        unwrap_causal_lm(model).config.pad_token_id = tokenizer.pad_token_id
    placement = reference_placement(cfg, device)
    model, reference_cpu = prepare_for_training(model, cfg, device if placement == "device" else None,
                                                adapters_attached=is_peft(model))
    return Policy(model, tokenizer, device, dtype, reference_cpu, placement)


def prepare_for_training(model: torch.nn.Module, cfg: Config, reference_device: torch.device | None = None,
                         adapters_attached: bool = False) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """LoRA adapters (or, for full fine-tuning with beta > 0, a frozen copy as the reference policy: in host
    memory, or on ``reference_device`` when given), gradient checkpointing, dropout off when asked, train
    mode: ``(model, reference copy or None)``. ``adapters_attached``: a peft model whose LoRA adapters the
    caller attached (they are the ones trained; none are added)."""
    reference_cpu = None
    if adapters_attached:
        adapters_in_input_dtype(model)
    elif cfg.lora.enabled:
        model = apply_lora(model, cfg.lora, quantized=cfg.model.load_in_4bit)
    elif cfg.needs_reference:  # beta > 0, or PPO's KL reward (kl_coef > 0)
        reference_cpu = reference_copy(model, reference_device or torch.device("cpu"))
    if cfg.memory.gradient_checkpointing:
        unwrap_causal_lm(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if cfg.lora.enabled:
            unwrap_causal_lm(model).enable_input_require_grads()
    if cfg.model.disable_dropout:
        disable_dropout(model)
    model.train()
    return model, reference_cpu


REFERENCE_PLACEMENTS = ("auto", "device", "stream", "host")
HOST_ALIGN = 64  # bytes: each tensor of a host copy starts on this boundary (torch's CPU allocator's alignment)


def reference_placement(cfg: Config, device: torch.device) -> str:
    """Where the full-fine-tuning reference lives (``memory.reference_placement``): on a CPU everything is host
    memory ("host", today's path); on CUDA ``auto`` is resolved by the plan before weights load
    (the admission, ``plan/admission.py``, writes "device" or "stream" into the config); a config that never met the planner
    (the Python API, an architecture it does not model) streams, the choice that needs least device memory."""
    value = cfg.memory.reference_placement
    if device.type != "cuda":
        return "host"
    return "stream" if value == "auto" else value


def _unique_tensors(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of ``model`` once (tied weights are one tensor)."""
    seen: dict[int, torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen.setdefault(id(t), t)
    return list(seen.values())


def reference_copy(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A frozen copy of ``model`` (eval mode, no gradients) with its parameters and buffers on ``device``.

    ``copy.deepcopy(model).to("cpu")`` first cloned every weight where it was, a second full copy on the GPU
    that neither the plan nor the trace saw. Here the tensors are copied one by one straight to their place
    and handed to ``deepcopy`` through its memo, so it copies only the modules' structure around them. A host
    copy is one exact-size byte buffer (``host_buffer``, a ``memory.pinned.HostBuffer``, on the returned module;
    None for a device copy) that every tensor is a view
    of: it can be pinned in place (``cudaHostRegister``) for streaming, with no power-of-two rounding."""
    tensors = _unique_tensors(model)
    memo: dict[int, Any] = {}
    if device.type == "cpu":
        offsets, total = [], 0
        for t in tensors:
            offsets.append(total)
            total += -(-t.numel() * t.element_size() // HOST_ALIGN) * HOST_ALIGN
        flat = page_aligned_empty(total)  # whole pages: pinned in place later (memory/pinned.py)
        for t, off in zip(tensors, offsets):
            view = flat[off:off + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            view.copy_(t.detach())
            memo[id(t)] = torch.nn.Parameter(view, requires_grad=False) if isinstance(t, torch.nn.Parameter) else view
    else:
        flat = None
        for t in tensors:
            copied = t.detach().to(device, copy=True)
            memo[id(t)] = torch.nn.Parameter(copied, requires_grad=False) if isinstance(t, torch.nn.Parameter) \
                else copied
    reference = copy.deepcopy(model, memo)
    reference.host_buffer = HostBuffer(flat) if flat is not None else None  # streamed from, pinned once
    return reference.eval().requires_grad_(False)


def disable_dropout(model: torch.nn.Module) -> int:
    """p = 0 in every ``nn.Dropout`` (TRL's ``disable_dropout_in_model``); returns how many were set."""
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    for m in layers:
        m.p = 0.0
    return len(layers)
