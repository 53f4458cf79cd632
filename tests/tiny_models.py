"""Tiny tokenizers and models built in code (no hub), for the tests and for scripts that run without pytest
(tests/vllm_real_check.py, in the vLLM environment). conftest.py re-exports them."""

from __future__ import annotations

from pathlib import Path

import torch

CORPUS = [
    "What is 12 plus 30? The answer is 42.",
    "Question: Tom has 3 apples and buys 5 more. How many apples? #### 8",
    "<think>add the numbers</think><answer>17</answer>",
    "The quick brown fox jumps over the lazy dog 0123456789 + - * / = $ % , .",
]


def build_tokenizer(folder: Path, vocab_size: int = 300, chat_template: bool = False):
    """Train a byte-level BPE tokenizer in about a second and save it as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", bos_token="<bos>")
    if chat_template:
        fast.chat_template = (
            "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}"
        )
    fast.save_pretrained(str(folder))
    return fast


def build_tiny_model(folder: Path, vocab_size: int, seed: int = 0, tie: bool = True, layers: int = 2,
                     hidden: int = 32, max_positions: int = 512):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=hidden * 2,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, tie_word_embeddings=tie,
                      pad_token_id=0, eos_token_id=1, bos_token_id=2)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(folder), safe_serialization=True)
    return model
