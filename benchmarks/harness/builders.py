"""The inputs of a benchmark, built locally (no model or dataset hub): random-init model folders of a given
shape with a byte-level BPE tokenizer of the same vocabulary, the model shapes of ``model_shapes.json``, and
prompt files of GSM8K test questions. Memory and time do not depend on whether the weights are trained, only on
the shape."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from benchmarks.harness.paths import BENCH_DIR, GSM8K_DIR, MODEL_SHAPES

# W-cpu's model: Qwen2-shaped, a real Qwen2.5 vocabulary size, tiny everything else.
W_CPU_SHAPE = {"family": "qwen2", "hidden": 128, "intermediate": 512, "layers": 2, "heads": 4, "kv_heads": 2,
               "vocab": 151936, "tie": True, "max_positions": 32768}

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"

# The system prompt of the GRPO GSM8K recipes W-real follows (reasoning and answer tags).
REASONING_SYSTEM_PROMPT = ("Respond in the following format:\n<reasoning>\n...\n</reasoning>\n"
                           "<answer>\n...\n</answer>")


# ----------------------------------------------------------------------------- tokenizer and model


def build_tokenizer(out_dir: Path, vocab_size: int, corpus: list[str] | None = None) -> None:
    """A byte-level BPE tokenizer with exactly ``vocab_size`` entries, saved as PreTrainedTokenizerFast.

    BPE is trained on GSM8K text up to 32K tokens; the rest of the vocabulary is filled with extra
    merges of existing tokens (ordinary BPE merges of low priority, like the long tail of a real
    tokenizer), so every id the model can sample decodes to text and nothing is an "added token".
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = [EOS_TOKEN, PAD_TOKEN]
    corpus = corpus if corpus is not None else _gsm8k_text()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 32000), special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)

    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    merges: list[list[str]] = spec["model"]["merges"]
    ordinary = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in specials]
    need = vocab_size - len(vocab)
    if need > 0:
        for a in ordinary:
            for b in ordinary:
                if a + b not in vocab:
                    vocab[a + b] = len(vocab)
                    merges.append([a, b])
                    need -= 1
                    if need == 0:
                        break
            if need == 0:
                break
    tok = Tokenizer.from_str(json.dumps(spec))
    if tok.get_vocab_size(with_added_tokens=True) != vocab_size:
        raise AssertionError(f"tokenizer has {tok.get_vocab_size()} entries, wanted {vocab_size}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN,
                                   model_max_length=1 << 20)
    fast.padding_side = "left"
    fast.save_pretrained(str(out_dir))
    # AutoTokenizer on a folder whose config.json says qwen2 would otherwise build a Qwen2 tokenizer class.
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2))


def _gsm8k_text() -> list[str]:
    rows = [json.loads(line) for line in (GSM8K_DIR / "train.jsonl").read_text().splitlines() if line.strip()]
    return [r["question"] + "\n" + r["answer"] for r in rows]


def shape_key(shape: dict[str, Any], dtype: str) -> str:
    s = shape
    return (f"{s['family']}-v{s['vocab']}-h{s['hidden']}-i{s['intermediate']}-l{s['layers']}-a{s['heads']}"
            f"-kv{s['kv_heads']}-{'tie' if s['tie'] else 'untied'}-{dtype}")


def build_model_folder(shape: dict[str, Any], dtype: str = "float32", root: Path | None = None,
                       seed: int = 0, corpus: list[str] | None = None) -> Path:
    """A random-init causal LM of ``shape`` (keys as in model_shapes.json) plus a tokenizer of the same
    vocabulary size, saved with safetensors under ``root`` (default ``.bench/models``) and reused when
    it already exists. Returns the folder."""
    root = root or BENCH_DIR / "models"
    folder = root / shape_key(shape, dtype)
    if (folder / "model.safetensors.index.json").is_file() or (folder / "model.safetensors").is_file():
        if (folder / "tokenizer.json").is_file():
            return folder

    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)

    build_tokenizer(tmp, shape["vocab"], corpus)  # corpus None: GSM8K text
    eos_id, pad_id = _special_ids(tmp)
    common = dict(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["intermediate"],
                  num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                  num_key_value_heads=shape["kv_heads"], tie_word_embeddings=shape["tie"],
                  max_position_embeddings=shape.get("max_positions", 32768), bos_token_id=eos_id,
                  eos_token_id=eos_id, pad_token_id=pad_id)
    if shape["family"] == "qwen2":
        config, cls = Qwen2Config(**common), Qwen2ForCausalLM
    elif shape["family"] == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    else:
        raise ValueError(f"unknown model family {shape['family']!r} (qwen2 or llama)")
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch_dtype)  # initialise directly in the target dtype (8B in fp32 would not fit)
    try:
        # Random init of a multi-billion-parameter model is much faster on a GPU when there is one.
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = cls(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config = GenerationConfig(bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(str(tmp), safe_serialization=True)
    del model
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def _special_ids(folder: Path) -> tuple[int, int]:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(folder))
    return tok.eos_token_id, tok.pad_token_id


def load_shape(name: str) -> dict[str, Any]:
    """A shape of ``shared/data/model_shapes.json`` by name, as the dict ``build_model_folder`` takes."""
    shapes = json.loads(MODEL_SHAPES.read_text())
    shapes.pop("_note", None)
    if name not in shapes:
        raise ValueError(f"unknown model shape {name!r}; known: {', '.join(sorted(shapes))}")
    return shapes[name]


# ----------------------------------------------------------------------------- prompts


def gsm8k_test(count: int) -> list[tuple[str, str]]:
    """``(question, final answer)`` of the first ``count`` GSM8K test rows."""
    out = []
    with open(GSM8K_DIR / "test.jsonl") as f:
        for line in f:
            if len(out) >= count:
                break
            r = json.loads(line)
            out.append((r["question"].strip(), r["answer"].split("####")[-1].strip()))
    return out


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_prompts(path: Path, count: int) -> Path:
    """The first ``count`` GSM8K test questions as a JSONL file with a ``prompt`` column (and ``answer``)."""
    return _write_jsonl(path, [{"prompt": q + "\nAnswer:", "answer": a} for q, a in gsm8k_test(count)])


def write_chat_prompts(path: Path, count: int, system_prompt: str = REASONING_SYSTEM_PROMPT) -> Path:
    """The first ``count`` GSM8K test questions as conversational prompts (system + user messages)."""
    return _write_jsonl(path, [{"prompt": [{"role": "system", "content": system_prompt},
                                           {"role": "user", "content": q}], "answer": a}
                               for q, a in gsm8k_test(count)])
