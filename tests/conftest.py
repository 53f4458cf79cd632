"""Shared fixtures: tiny models and tokenizers built in code (no hub), prompt files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

# Built in code, no hub; in a module of their own, importable without pytest (tests/vllm_real_check.py runs
# in the vLLM environment, which has no pytest), re-exported here for the tests that import them from conftest.
from tiny_models import build_tiny_model, build_tokenizer  # noqa: F401

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
