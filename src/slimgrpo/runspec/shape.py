"""Model architecture shapes: the few numbers the memory planner needs about a model.

A shape comes from one of three places (see :func:`load_shape`):

* a bundled preset (``shapes.json``, public ``config.json`` figures of popular open models),
* a ``config.json`` file,
* a model folder that contains a ``config.json``.

No weights are read and nothing is downloaded: memory depends only on the architecture.

Parameter count of a llama/qwen2-style decoder (``num_params``), with
``H`` hidden, ``I`` intermediate, ``L`` layers, ``V`` vocabulary, ``d`` head_dim,
``q = heads·d`` and ``kv = kv_heads·d``::

    embedding      V·H
    per layer      H·q + 2·H·kv + q·H          attention q, k, v, o projections
                 + 3·H·I                       MLP gate, up, down
                 + 2·H                         input and post-attention RMSNorm
                 + (q + 2·kv)                  q/k/v biases            (qwen2 only)
                 + 2·d                         per-head q/k RMSNorm    (qwen3 only)
    final norm     H
    lm_head        V·H                         only when not tied to the embedding
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from slimgrpo.config.context import position_limit
from slimgrpo.families import FAMILIES
from slimgrpo.model_gguf import gguf_config, is_gguf

# Suffixes dropped when a Hugging Face model id is matched against the presets
# ("Qwen/Qwen2.5-0.5B-Instruct" -> "qwen2.5-0.5b"): chat tuning does not change the shape.
_ID_SUFFIXES = ("-instruct", "-chat", "-base", "-it")


@dataclass(frozen=True)
class ModelShape:
    """Architecture numbers of a decoder-only transformer (llama / qwen2 / qwen3 / mistral style)."""

    family: str  # "llama" | "mistral" | "qwen2" | "qwen3" (see FAMILIES)
    hidden: int  # H, width of the residual stream
    intermediate: int  # I, width of the gated MLP
    layers: int  # L, number of decoder layers
    heads: int  # attention (query) heads
    kv_heads: int  # key/value heads (grouped-query attention when < heads)
    vocab: int  # V, rows of the embedding (and of the LM head)
    tie: bool  # the LM head shares the embedding matrix
    max_positions: int = 0  # max_position_embeddings; 0 when unknown
    head_dim: int = 0  # d; 0 means hidden // heads (filled in by __post_init__)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(
                f"unsupported model family {self.family!r}; the planner knows {sorted(FAMILIES)} "
                "(other decoder-only models with a gated MLP are usually well approximated by 'llama')"
            )
        for name in ("hidden", "intermediate", "layers", "heads", "kv_heads", "vocab"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelShape.{name} must be a positive integer, got {value!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ValueError(
                    f"hidden ({self.hidden}) is not divisible by heads ({self.heads}); give head_dim explicitly"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        elif self.head_dim < 0:
            raise ValueError(f"head_dim must be positive, got {self.head_dim}")

    @property
    def q_dim(self) -> int:
        """Width of all query heads together: heads · head_dim."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of all key (or value) heads together: kv_heads · head_dim."""
        return self.kv_heads * self.head_dim

    def linear_dims(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each projection in one decoder layer."""
        H, I, q, kv = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        return {
            "q_proj": (H, q),
            "k_proj": (H, kv),
            "v_proj": (H, kv),
            "o_proj": (q, H),
            "gate_proj": (H, I),
            "up_proj": (H, I),
            "down_proj": (I, H),
        }

    @property
    def layer_linear_params(self) -> int:
        """Weights of the seven projections of one layer (what 4-bit quantisation compresses)."""
        return sum(i * o for i, o in self.linear_dims().values())

    @property
    def layer_params(self) -> int:
        """All parameters of one decoder layer: projections, biases, norms."""
        extra = FAMILIES[self.family]
        n = self.layer_linear_params + 2 * self.hidden
        if extra["qkv_bias"]:
            n += self.q_dim + 2 * self.kv_dim
        if extra["qk_norm"]:
            n += 2 * self.head_dim
        return n

    @property
    def embedding_params(self) -> int:
        """V · H, the input embedding (and, untied, the same again for the LM head)."""
        return self.vocab * self.hidden

    @property
    def num_params(self) -> int:
        """Total parameter count, counting a tied embedding/LM head once (see module docstring)."""
        head = 0 if self.tie else self.embedding_params
        return self.embedding_params + self.layers * self.layer_params + self.hidden + head

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> ModelShape:
        """Build a shape from a Hugging Face ``config.json`` dictionary.

        Reads ``model_type``, ``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
        ``num_attention_heads``, ``num_key_value_heads`` (default: heads), ``vocab_size``,
        ``tie_word_embeddings`` (default: False, as in the llama/qwen2 configs),
        ``max_position_embeddings`` stretched by its rope scaling (``config/context.py``: Qwen3-8B with YaRN
        x4 over 32,768 gives 131,072) and ``head_dim`` (default: hidden // heads).
        A multimodal config whose language model sits under ``text_config`` is read from there.
        """
        if not isinstance(config, dict):
            raise ValueError(f"expected a config.json dictionary, got {type(config).__name__}")
        if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
            config = {**config["text_config"], "tie_word_embeddings": config.get("tie_word_embeddings")}
        required = ["hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size"]
        missing = [k for k in required if config.get(k) is None]
        if missing:
            raise ValueError(f"config.json lacks {missing}; is it a decoder-only language model config?")
        model_type = str(config.get("model_type", "llama"))
        family = model_type if model_type in FAMILIES else None
        if family is None:
            raise ValueError(
                f"model_type {model_type!r} is not one the planner models ({sorted(FAMILIES)}); "
                "write a config.json with model_type 'llama' and the same sizes to get an approximate plan"
            )
        heads = int(config["num_attention_heads"])
        tie = config.get("tie_word_embeddings")
        return cls(
            family=family,
            hidden=int(config["hidden_size"]),
            intermediate=int(config["intermediate_size"]),
            layers=int(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            vocab=int(config["vocab_size"]),
            tie=bool(tie) if tie is not None else False,
            max_positions=position_limit(config)[0] or 0,
            head_dim=int(config.get("head_dim") or 0),
        )


def preset_shapes() -> dict[str, ModelShape]:
    """The bundled presets of ``shapes.json``, by lower-case name."""
    text = resources.files("slimgrpo.runspec").joinpath("shapes.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    return {name.lower(): ModelShape(**fields) for name, fields in raw.items() if not name.startswith("_")}


def _preset_key(spec: str) -> str:
    """Normalise a preset name or a hub id: 'Qwen/Qwen2.5-0.5B-Instruct' -> 'qwen2.5-0.5b'."""
    key = spec.strip().lower().rsplit("/", 1)[-1]
    for suffix in _ID_SUFFIXES:
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key


def _read_config(path: Path) -> ModelShape:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    try:
        return ModelShape.from_hf_config(config)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err


def load_shape(spec: str | os.PathLike[str]) -> ModelShape:
    """Resolve ``spec`` to a :class:`ModelShape`.

    Tried in order: a GGUF file (its metadata), an existing file (a ``config.json``), an existing folder holding a
    ``config.json``, then a bundled preset name (case-insensitive; a hub id such as
    ``meta-llama/Llama-3.1-8B-Instruct`` matches the preset ``llama-3.1-8b``).
    Raises ``ValueError`` naming what was tried and the closest preset names.
    """
    text = os.fspath(spec)
    if not text.strip():
        raise ValueError("empty model spec: give a preset name (e.g. 'qwen2.5-0.5b') or a path to config.json")
    path = Path(text).expanduser()
    if is_gguf(path):
        try:
            return ModelShape.from_hf_config(gguf_config(path))
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from err
    if path.is_file():
        return _read_config(path)
    if path.is_dir():
        config = path / "config.json"
        if not config.is_file():
            raise ValueError(f"folder {path} has no config.json; point at the model folder or the file itself")
        return _read_config(config)

    presets = preset_shapes()
    key = _preset_key(text)
    if key in presets:
        return presets[key]
    close = difflib.get_close_matches(key, list(presets), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"cannot resolve model {text!r}: no file or folder at {str(path)!r} and no preset named {key!r}.{hint} "
        f"Presets: {', '.join(sorted(presets))}; or pass a path to a config.json or to a model folder."
    )
