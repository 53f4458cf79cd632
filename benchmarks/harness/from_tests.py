"""Helpers the benchmarks share with the tests, loaded from their files in ``tests/`` (which is no package): the
naive LM-head log-probs of ``tests/_reference.py``, the full-logits baseline the loss benchmarks measure the
chunked head against, so that both hold the chunked head to one reference."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from benchmarks.harness.paths import REPO_ROOT


def tests_module(name: str) -> ModuleType:
    """``tests/NAME.py`` as a module (its own imports are the tests' own)."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "tests" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_naive_token_logprobs():
    """``tests/_reference.py``'s ``naive_token_logprobs``: full ``[N, V]`` logits, ``log_softmax`` and gather."""
    return tests_module("_reference").naive_token_logprobs
