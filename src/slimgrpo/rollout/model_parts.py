"""The pieces of a causal LM the rollout engine drives directly: decoder stack and LM head.

The engine never calls the full ``ForCausalLM.forward``: that would build logits for every position
of the prompt. It runs the decoder, keeps the last hidden state of each row and applies the LM head to
that one position only, reproducing the model's own logit post-processing (softcapping / scaling).

Works on a plain Hugging Face causal LM and on a peft ``PeftModel``: LoRA layers are injected into the
base model's modules in place, so calling the base model's decoder runs the adapters that are active.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from slimgrpo.causal_lm import unwrap_causal_lm
from slimgrpo.target import DeviceTarget


class CausalLMParts:
    """Decoder, LM head and logit post-processing of a (possibly peft-wrapped) causal LM."""

    def __init__(self, model: nn.Module, target: DeviceTarget | None = None) -> None:
        base = unwrap_causal_lm(model)
        if not hasattr(base, "get_decoder") or not hasattr(base, "get_output_embeddings"):
            raise ValueError(
                f"{type(base).__name__} is not a Hugging Face causal LM (needs get_decoder() and "
                "get_output_embeddings())"
            )
        self.root = model  # what the trainer holds; its train/eval mode is saved and restored
        self.base = base
        self.decoder = base.get_decoder()
        self.lm_head = base.get_output_embeddings()
        if self.decoder is None or self.lm_head is None:
            raise ValueError(f"{type(base).__name__} has no decoder or no LM head")
        config = base.config.get_text_config() if hasattr(base.config, "get_text_config") else base.config
        self.config = base.config
        # Logit post-processing some architectures apply after the LM head.
        self.softcap = getattr(config, "final_logit_softcapping", None)  # Gemma 2/3: cap * tanh(x / cap)
        self.logit_scale = getattr(config, "logit_scale", None)  # Cohere: x * scale
        self.logits_scaling = getattr(config, "logits_scaling", None)  # Granite: x / scaling
        # While ``packed_weights`` is open: module -> (oneDNN-packed weight, bias); a group of projections
        # that read the same input (q/k/v, gate/up) -> (one packed weight of their rows, bias, rows each);
        # peft LoRA Linear -> W + its active adapters' delta (where it is not packed).
        self.packed: dict[nn.Module, tuple[torch.Tensor, torch.Tensor | None]] = {}
        self.fused: dict[tuple[nn.Module, ...], tuple[torch.Tensor, torch.Tensor | None, list[int]]] = {}
        self.merged: dict[nn.Module, torch.Tensor] = {}
        self.handled: set[nn.Module] = set()  # modules in ``packed`` or ``fused`` (or a trace's stand-in)
        self.standins: list[torch.Tensor] = []  # a memory trace's packed copies (``_reorder``)
        # The device whose choices decoding takes (the LoRA merge, oneDNN packing, GQA without repeated K/V): the
        # weights' own, or the one a memory trace simulates (slimgrpo/target.py)
        param = next(model.parameters(), None)
        self.target = target or DeviceTarget.of(param if param is not None else torch.device("cpu"))

    @property
    def device(self) -> torch.device:
        return next(self.root.parameters()).device

    def linear(self, module: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """``module(x)``, through the module's packed weight while ``packed_weights`` holds one, or its
        LoRA-merged weight (``W + scale B A``, one product instead of three)."""
        packed = self.packed.get(module)
        if packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, packed[0], packed[1], "none", [], "")
        merged = self.merged.get(module)
        if merged is not None:
            return torch.nn.functional.linear(x, merged, module.base_layer.bias)
        return module(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head on last-position hidden states: ``[N, H] -> [N, V]`` in float32."""
        y = self.linear(self.lm_head, hidden).float()  # [N, V]
        if self.logits_scaling is not None and self.logits_scaling != 1:
            y = y / self.logits_scaling
        if self.logit_scale is not None and self.logit_scale != 1:
            y = y * self.logit_scale
        if self.softcap:
            y = torch.tanh(y / self.softcap) * self.softcap
        return y

    @contextlib.contextmanager
    def packed_weights(self, rows: int, which: str = "auto") -> Iterator[None]:
        """Pre-pack linear weights for oneDNN for the duration of one ``generate`` call (CPU only).

        A decode step multiplies a handful of rows by each weight; MKL's generic sgemm re-packs the
        weight on every call and runs well below oneDNN with a weight packed once (AMD EPYC, 2 threads,
        SmolLM2's layer shapes at 16 rows: 8.1 GB/s of weights unpacked, 13.8 packed, 17.5 packed and
        fused; the LM head 1.9x). The packed copies live only inside this context (weights change after
        every optimizer step) and cost their size in memory:

        * ``"head"`` (and ``"auto"``, which ``TorchRolloutEngine`` resolves before it gets here): the LM
          head only (the largest matrix of small models);
        * ``"all"``: the LM head and every linear layer of the decoder, with the projections that read the
          same input stacked into one weight (q/k/v, gate/up: ``stacked_product``), so a decode step runs 4
          products per layer instead of 7 (one more copy of the decoder weights during generation; the
          lean Llama stepper uses them, ``TorchRolloutEngine`` picks it for that stepper on CPU);
        * ``"none"``: nothing.

        Only float32 weights on CPU are packed; GPU weights, other dtypes and sharded (DTensor) weights run
        through the module. The oneDNN ops are private PyTorch API: if they are missing or refuse a
        weight, that module is simply not packed.

        Unless ``"none"``, LoRA layers on CPU decode through a merged weight
        ``W + scale B A`` of their active adapters (``_mergeable``): one product per layer instead of the
        base product plus two thin adapter products. With ``"all"`` the merged weight is packed (the packed
        copy replaces it); otherwise it is held in the base weight's dtype while generating (the plan's
        ``decode weights`` line). The merged copies are separate tensors: the base weights are never
        modified.

        Both choices follow ``self.target`` (``slimgrpo/target.py``): a trace of a CUDA step (fake tensors on the
        CPU device) takes the CUDA path, which merges and packs nothing.
        """
        if which not in ("auto", "head", "all", "none"):
            raise ValueError(f"pack_weights must be 'auto', 'head', 'all' or 'none', got {which!r}")
        with torch.no_grad():
            if which != "none":
                self._pack(self.lm_head, rows)
            if which == "all":
                for group in _projection_groups(self.decoder):
                    self._pack_group(group, rows)
                inner = {sub for m in self.decoder.modules() if hasattr(m, "base_layer")
                         for sub in m.modules() if sub is not m}  # a LoRA layer's base and adapters
                for module in self.decoder.modules():
                    if module not in inner and module not in self.handled:
                        self._pack(module, rows)
            if which != "none":  # LoRA layers not packed above decode through a merged weight
                for module in self.decoder.modules():
                    if module not in self.handled and _mergeable(module, self.target):
                        self.merged[module] = _merged_weight(module)
        try:
            yield
        finally:
            self.packed.clear()
            self.fused.clear()
            self.merged.clear()
            self.standins.clear()
            self.handled.clear()

    def _weight_and_bias(self, module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The weight a decode product uses (a LoRA layer's ``W + scale B A``, made here and dropped once
        packed) and its bias; None where it cannot be packed."""
        if _mergeable(module, self.target):
            base = module.base_layer
            if not _packable_weight(base.weight, self.target):
                return None
            return _merged_weight(module), base.bias
        if type(module) is not nn.Linear or not _packable_weight(module.weight, self.target):
            return None
        return module.weight.detach(), module.bias

    def _pack(self, module: nn.Module, rows: int) -> None:
        found = self._weight_and_bias(module)
        if found is None:
            return
        packed = self._reorder((module,), found[0], rows)
        if packed is not None:
            self.packed[module] = (packed, found[1])

    def _pack_group(self, group: tuple[nn.Module, ...], rows: int) -> None:
        """One packed weight for projections of the same input (their rows stacked): one product instead of
        three (q/k/v) or two (gate/up). Skipped unless every member is packable with biases all or none."""
        found = [self._weight_and_bias(m) for m in group]
        if any(f is None for f in found) or len({f[1] is None for f in found}) != 1:
            return
        stacked = torch.cat([f[0] for f in found])
        rows_each = [f[0].shape[0] for f in found]
        bias = None if found[0][1] is None else torch.cat([f[1].detach() for f in found])
        del found
        packed = self._reorder(group, stacked, rows)
        if packed is not None:
            self.fused[group] = (packed, bias, rows_each)

    def _reorder(self, modules: tuple[nn.Module, ...], weight: torch.Tensor, rows: int) -> torch.Tensor | None:
        """``weight`` packed for oneDNN products of ``rows`` rows, ``modules`` marked as handled; None
        where the private op is missing or refuses it. In a memory trace (fake tensors, which oneDNN
        cannot take) a stand-in of the weight's size is held instead and the modules run unpacked, so the
        trace counts the bytes a real run holds."""
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        except (RuntimeError, AttributeError, NotImplementedError, TypeError):  # op missing or refused
            if not self.target.simulated:
                return None
            self.standins.append(torch.empty_like(weight))
            packed = None
        self.handled.update(modules)
        return packed


def stacked_product(stacked: tuple[torch.Tensor, torch.Tensor | None, list[int]], x: torch.Tensor):
    """The outputs of a group of projections (``CausalLMParts.fused``: q/k/v, gate/up) from one product
    through their stacked packed weight, split into views."""
    weight, bias, rows = stacked
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "").split(rows, dim=-1)


def _projection_groups(decoder: nn.Module) -> list[tuple[nn.Module, ...]]:
    """(q, k, v) of every attention block and (gate, up) of every gated MLP: products of one input."""
    groups = []
    for module in decoder.modules():
        for names in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            if all(isinstance(getattr(module, n, None), nn.Module) for n in names):
                groups.append(tuple(getattr(module, n) for n in names))
    return groups


def _mergeable(module: nn.Module, target: DeviceTarget) -> bool:
    """A peft LoRA ``Linear`` on CPU whose active adapters are plain LoRA (no DoRA), not merged into
    the base already, adapters enabled, over a plain ``nn.Linear`` base."""
    base = getattr(module, "base_layer", None)
    if type(base) is not nn.Linear or not hasattr(module, "get_delta_weight") or not hasattr(module, "lora_A"):
        return False
    active = [a for a in getattr(module, "active_adapters", []) if a in module.lora_A]
    return (
        bool(active)
        and not getattr(module, "merged", False)
        and not getattr(module, "disable_adapters", False)
        and not any(getattr(module, "use_dora", {}).get(a, False) for a in active)
        and not getattr(module, "fan_in_fan_out", False)
        and target.kind_of(base.weight) == "cpu"
        and not hasattr(base.weight, "device_mesh")
    )


def _merged_weight(module: nn.Module) -> torch.Tensor:
    """``W + Σ scale·B·A`` over the active adapters, summed in the adapters' dtype (fp32) and stored in
    ``W``'s dtype: the decode product ``x @ merged`` then runs in the compute dtype, as the base's does."""
    weight = module.base_layer.weight
    total = None
    for a in module.active_adapters:
        if a in module.lora_A:
            delta = module.get_delta_weight(a)
            total = delta if total is None else total.add_(delta)
    return total.add_(weight).to(weight.dtype)


def _packable_weight(weight: torch.Tensor, target: DeviceTarget) -> bool:
    """A float32 CPU weight oneDNN can pack (not a sharded DTensor, not a CUDA trace's stand-in)."""
    return (
        target.kind_of(weight) == "cpu"
        and weight.dtype == torch.float32
        and not hasattr(weight, "device_mesh")  # a sharded DTensor (FSDP2)
        and torch.backends.mkldnn.is_available()
    )


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Put every submodule in eval mode and restore each one's own mode afterwards.

    Eval mode turns off dropout and, with gradient checkpointing on, stops Hugging Face models from
    disabling the KV cache (they only checkpoint, and drop the cache, while ``training`` is True).
    """
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, was_training in modes:
            module.training = was_training

