"""``slimgrpo export``: a trained adapter merged into its base (one plain Hugging Face folder), or the
adapter alone; both load with plain transformers / peft."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from slimgrpo.modeling import ModelLoadError, load_tokenizer


def find_model_folder(path: str) -> Path:
    """A run folder (uses its ``final/``), a checkpoint folder (its ``model/``), or a model/adapter folder."""
    p = Path(path)
    for candidate in (p / "final", p / "model", p):
        if (candidate / "adapter_config.json").is_file() or (candidate / "config.json").is_file():
            return candidate
    raise ModelLoadError(f"{path}: no model or adapter found (looked for final/, model/ and the folder itself)")


def export_model(source: str, out: str, merge: bool = True, base: str | None = None) -> Path:
    src, dst = find_model_folder(source), Path(out)
    if dst.exists() and any(dst.iterdir()):
        raise ModelLoadError(f"{dst} exists and is not empty: choose another --out")
    if not (src / "adapter_config.json").is_file():
        if not merge:  # --adapter-only: there is no adapter to export, and copying the model would mislead
            raise ModelLoadError(
                f"{src} holds a full model (a full fine-tune, lora.enabled=false), not a LoRA adapter: "
                "--adapter-only has nothing to export; drop --adapter-only to copy the full model")
        shutil.copytree(src, dst, dirs_exist_ok=True)  # already a full model
        return dst
    base_path = base or json.loads((src / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base_path or not Path(base_path).exists():
        raise ModelLoadError(f"{src}: the adapter's base model {base_path!r} is not a local folder; pass --base PATH")
    tok_dir = src if (src / "tokenizer.json").is_file() else Path(base_path)
    if not merge:
        shutil.copytree(src, dst, dirs_exist_ok=True)
        return dst
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype="auto")
    merged = PeftModel.from_pretrained(model, str(src)).merge_and_unload()
    merged.save_pretrained(str(dst), safe_serialization=True)
    load_tokenizer(str(tok_dir)).save_pretrained(str(dst))
    return dst


def export_command(args) -> int:
    out = export_model(args.source, args.out, merge=not args.adapter_only, base=args.base)
    print(f"exported {'adapter' if args.adapter_only else 'model'} to {out}")
    return 0
