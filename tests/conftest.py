"""Shared fixtures: tiny models and tokenizers built in code (no hub), prompt files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

torch.set_num_threads(min(torch.get_num_threads(), 2))

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"  # the shipped recipes and example rewards


def load_example_module(name: str = "custom_reward"):
    """``examples/NAME.py`` as a module (the example reward functions)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _find_gsm8k() -> Path:
    """GSM8K's test split from the shared data beside the checkout; a worktree or clone elsewhere reads the
    workplace's copy in /work/shared."""
    for root in (SHARED, Path("/work/shared")):
        if (root / "data" / "gsm8k" / "test.jsonl").is_file():
            return root / "data" / "gsm8k" / "test.jsonl"
    return SHARED / "data" / "gsm8k" / "test.jsonl"


GSM8K_TEST = _find_gsm8k()
# A test that reads GSM8K skips with this reason where the shared data is absent (a copy of the project
# alone), instead of failing on a missing file that is not the code's fault.
needs_gsm8k = pytest.mark.skipif(not GSM8K_TEST.is_file(),
                                 reason=f"GSM8K's test split is not at {GSM8K_TEST} (../shared/data/gsm8k)")

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


QUIETED_LOGGERS = ("transformers", "torch", "torchao", "peft", "datasets", "accelerate", "huggingface_hub")
# The levels before any test ran (conftest is imported before the test modules): a module- or session-scoped
# fixture may quiet the process before a test's own fixtures start, so "before this test" is not the baseline.
_BASE_LEVELS = {name: logging.getLogger(name).level for name in QUIETED_LOGGERS}


def _undo_quieting() -> None:
    from slimgrpo.output.console import _OwnMessagesOnly

    for handler in logging.getLogger().handlers:
        for f in [f for f in handler.filters if isinstance(f, _OwnMessagesOnly)]:
            handler.removeFilter(f)
    for name, level in _BASE_LEVELS.items():
        logging.getLogger(name).setLevel(level)


@pytest.fixture(autouse=True)
def _undo_quiet_third_party():
    """A run in this process calls ``quiet_third_party``, which filters the root logger's handlers (pytest's
    shared capture handlers among them) to slimgrpo's records and raises the library loggers to ERROR: without
    this, ``caplog`` would see no third-party WARNING in any later test. Undone before and after each test."""
    _undo_quieting()
    yield
    _undo_quieting()


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors gain nothing from intra-op threads, and on a shared machine OpenMP barriers waiting for
    a descheduled thread make every op slow: one thread for the module, the setting restored afterwards.
    Test modules opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2 model + tokenizer folder."""
    folder = tmp_path_factory.mktemp("tiny_model")
    tok = build_tokenizer(folder)
    build_tiny_model(folder, vocab_size=len(tok))
    return folder


@pytest.fixture(scope="session")
def tiny_chat_model_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny_chat_model")
    tok = build_tokenizer(folder, chat_template=True)
    build_tiny_model(folder, vocab_size=len(tok))
    return folder


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def arithmetic_prompts(tmp_path) -> Path:
    rows = [{"prompt": f"What is {a} plus {b}?", "answer": str(a + b)} for a in range(1, 5) for b in range(1, 5)]
    return write_jsonl(tmp_path / "prompts.jsonl", rows)
