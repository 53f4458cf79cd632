"""GGUF files (llama.cpp / Ollama) as a model source: read through transformers' GGUF support.

``model.path`` may name a ``.gguf`` file instead of a Hugging Face folder. transformers reads its
metadata (architecture, sizes, tokenizer, chat template) and dequantises the weights to ``model.dtype``;
the tokenizer comes from the same file. Nothing is written next to the user's file.
``convert_gguf`` writes a normal Hugging Face folder (safetensors, tokenizer, chat template) once, so
later loads skip the dequantisation (``scripts/get_smollm2.py`` uses it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from pathlib import Path
from typing import Any


class GGUFError(ValueError):
    """A GGUF file that cannot be read (missing file, missing ``gguf`` package, unsupported architecture)."""


def is_gguf(path: str | Path) -> bool:
    """``path`` names a GGUF file (by its suffix; it need not exist yet)."""
    return str(path).lower().endswith(".gguf")


def _check(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"GGUF file {str(p)!r} does not exist (model.path names a .gguf file)")
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError(f"{p}: reading GGUF files needs the 'gguf' package: pip install gguf")
    return p


def _damaged(p: Path, e: BaseException, what: str = "its metadata") -> GGUFError:
    """A GGUF file transformers cannot read: damaged (cut short), not a GGUF model, or an unsupported one."""
    return GGUFError(f"GGUF file {str(p)!r} is damaged (cut short?) or not a model transformers can read: "
                     f"reading {what} failed ({type(e).__name__}: {e}). Copy or download the file again, or "
                     "point model.path at another model.")


@functools.lru_cache(maxsize=8)
def _config_dict(path: str, size: int, mtime: float) -> dict[str, Any]:
    from transformers import AutoConfig

    p = Path(path)
    try:
        return AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name).to_dict()
    except Exception as e:  # struct.error / EOFError for a file cut short, ValueError for a foreign one
        raise _damaged(p, e) from None


def gguf_config(path: str | Path) -> dict[str, Any]:
    """The Hugging Face ``config.json`` dictionary described by a GGUF file's metadata (no weights read)."""
    p = _check(path).resolve()
    st = p.stat()
    return dict(_config_dict(str(p), st.st_size, st.st_mtime))


def load_gguf_tokenizer(path: str | Path):
    """The tokenizer stored in a GGUF file (vocabulary, merges, special tokens, chat template)."""
    from transformers import AutoTokenizer

    p = _check(path)
    try:
        tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        ids = _special_token_ids(p)
    except Exception as e:
        raise _damaged(p, e, "the tokenizer") from None
    # The file's own ids name the special tokens: transformers 5.17's Llama converter (the lent GPU machine's)
    # takes EOS from the BOS id and sets no PAD, so completions would "end" at BOS and never at EOS.
    for name, i in ids.items():
        if 0 <= i < len(tok):
            setattr(tok, name, tok.convert_ids_to_tokens(i))
    return tok


# The special tokens a GGUF file names by id (llama.cpp's metadata keys).
_SPECIAL_IDS = {"bos_token": "tokenizer.ggml.bos_token_id", "eos_token": "tokenizer.ggml.eos_token_id",
                "unk_token": "tokenizer.ggml.unknown_token_id", "pad_token": "tokenizer.ggml.padding_token_id"}


def _special_token_ids(p: Path) -> dict[str, int]:
    """{"eos_token": id, ...} for each special token the file's metadata names (the header only)."""
    from gguf import GGUFReader

    fields = GGUFReader(str(p)).fields
    out = {}
    for name, key in _SPECIAL_IDS.items():
        field = fields.get(key)
        if field is not None and field.data:
            out[name] = int(field.parts[field.data[0]][0])
    return out


@contextlib.contextmanager
def _quiet_dequantise():
    """transformers' GGUF reader draws its own tqdm bar ("Converting and de-quantizing GGUF tensors")
    whatever its progress-bar setting says; silence it, and the weight-loading bar, while we load."""
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as hf_logging

    bar, was = reader.tqdm, hf_logging.is_progress_bar_enabled()
    reader.tqdm = functools.partial(bar, disable=True)
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        reader.tqdm = bar
        if was:
            hf_logging.enable_progress_bar()


def load_gguf_model(path: str | Path, dtype, **kwargs: Any):
    """The causal LM of a GGUF file, its quantised weights dequantised to ``dtype``: a plain model
    (transformers marks GGUF-loaded models as quantised, which stops ``save_pretrained``; the weights
    are dense tensors by now, so the mark is dropped)."""
    from transformers import AutoModelForCausalLM

    p = _check(path)
    try:
        with _quiet_dequantise():
            model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=dtype, **kwargs)
    except Exception as e:
        raise _damaged(p, e, "the model") from None
    _drop_gguf_quantizer(model)
    return model


def _drop_gguf_quantizer(model) -> None:
    model.hf_quantizer = None
    model.is_quantized = False
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)


def convert_gguf(path: str | Path, out_dir: str | Path, dtype=None) -> Path:
    """Write a Hugging Face folder (config.json, model.safetensors, tokenizer files, chat template) for
    the GGUF file ``path``. ``out_dir`` must not exist yet or be empty: nothing is overwritten."""
    import torch

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise GGUFError(f"{out} already exists and is not empty: choose a new folder (nothing was written)")
    model = load_gguf_model(path, dtype or torch.float32)
    tok = load_gguf_tokenizer(path)
    out.mkdir(parents=True, exist_ok=True)
    with _quiet_dequantise():
        model.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out
