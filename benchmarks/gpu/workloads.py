"""What the GPU suite's tasks run on: the sizes of every section (the real ones, or tiny ones for ``--smoke``), the
model shapes (bundled presets; Qwen3-8B's public config), the device and dtype a task sets up for, and synthetic
text: the benchmark tokenizer's corpus and the prompts (the GPU machine has no GSM8K copy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def settings(smoke: bool) -> dict[str, Any]:
    """Sizes of every section: the real ones, or tiny ones for --smoke."""
    if smoke:
        tiny = {"family": "qwen2", "hidden": 64, "intermediate": 128, "layers": 2, "heads": 4, "kv_heads": 2,
                "vocab": 512, "tie": True, "max_positions": 512}
        tiny_llama = {**tiny, "family": "llama", "tie": False}
        return {"shapes": {"tiny-qwen2": tiny}, "long_shape": tiny_llama, "G": 2, "P": 8, "L": 8,
                "trl_shapes": ["tiny-qwen2"], "loss": {"tokens": 96, "hidden": 32, "vocab": 1000},
                "rollout": {"shape": "tiny-qwen2", "rows": 2, "prompt": 8, "new_tokens": 8, "repeats": 1},
                "long": {"shape": "tiny-llama", "rows": 2, "P": 8, "L": 64, "micro": 1},
                "quant": {"shape": "tiny-qwen2", "rows": 2, "P": 8, "L": 16}, "steps_timed": 2,
                "long_ctx": {"shape": "tiny-llama", "P": 8,
                             "rows": [{"L": 48, "offload": True}, {"L": 64}, {"L": 64, "offload": True}]}}
    return {"shapes": {n: None for n in ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-1.5b")}, "G": 4, "P": 256,
            "L": 786, "trl_shapes": ["qwen2.5-0.5b", "llama-3.2-1b"],
            "loss": {"tokens": 4096, "hidden": 896, "vocab": 151_936},
            "rollout": {"shape": "qwen2.5-0.5b", "rows": 8, "prompt": 64, "new_tokens": 256, "repeats": 2},
            "long": {"shape": "llama-3.1-8b", "rows": 8, "P": 256, "L": 20_000, "micro": 1},
            "quant": {"shape": "qwen2.5-0.5b", "rows": 4, "P": 256, "L": 786}, "steps_timed": 2,
            # docs/benchmarks.md#anchors-simulated (session 12): by trace P 256 + T 71,934 fits 24 GB with the
            # checkpoints offloaded and 8-bit AdamW; the whole 131,072 window (P 256 + T 130,816) fits 80 GB as
            # is, and with the checkpoints offloaded
            "long_ctx": {"shape": "qwen3-8b", "P": 256,
                         "rows": [{"L": 71_934, "offload": True, "optimizer": "adamw_8bit"}, {"L": 130_816},
                                  {"L": 130_816, "offload": True}]}}


QWEN3_8B = {"family": "qwen3", "hidden": 4096, "intermediate": 12288, "layers": 36, "heads": 32, "kv_heads": 8,
            "vocab": 151_936, "tie": False, "max_positions": 131_072, "head_dim": 128}  # its public config.json


def shape_of(name: str, spec: dict | None):
    from benchmarks.surface import ModelShape, load_shape

    return ModelShape(**spec) if spec else load_shape(name)


def shape_dict(shape) -> dict[str, Any]:
    return {"family": shape.family, "hidden": shape.hidden, "intermediate": shape.intermediate,
            "layers": shape.layers, "heads": shape.heads, "kv_heads": shape.kv_heads, "vocab": shape.vocab,
            "tie": shape.tie, "max_positions": shape.max_positions or 32_768}



def setup_device(ctx: dict) -> str:
    """The device a task sets up for: cuda in a dry run (its files are the GPU call's), else the suite's."""
    return "cuda" if ctx["dry_run"] else ctx["device"]


def setup_dtype(ctx: dict) -> str:
    return "bfloat16" if setup_device(ctx) == "cuda" else "float32"


def synthetic_corpus() -> list[str]:
    """Text to train the benchmark tokenizer on (the GPU machine has no GSM8K copy)."""
    words = ["apple", "number", "plus", "minus", "times", "answer", "question", "total", "each", "more"]
    return [f"Question {i}: {words[i % 10]} {i} {words[(3 * i) % 10]} {i * 7 % 97} = {i * 13 % 89}. "
            f"The answer is {i % 41}." for i in range(2000)]


def write_prompts(path: Path, count: int) -> Path:
    """Prompts of about 200 tokens (the Oxen setting caps prompts at 256)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    corpus = synthetic_corpus()
    rows = [{"prompt": " ".join(corpus[i * 20:(i + 1) * 20])[:700] + "\nAnswer:", "answer": "1"} for i in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
