"""docs/config.md must match the config dataclasses' docstrings."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

from slimgrpo.config import iter_fields

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_reference_is_up_to_date():
    gen = _generator()
    expected = gen.render()
    actual = gen.DOC_PATH.read_text() if gen.DOC_PATH.is_file() else ""
    if actual != expected:
        diff = "".join(list(difflib.unified_diff(actual.splitlines(True), expected.splitlines(True),
                                                 "docs/config.md (committed)", "docs/config.md (from the config package)"))[:40])
        raise AssertionError(
            f"docs/config.md is out of date with src/slimgrpo/config/. Regenerate it with:\n\n"
            f"    {gen.COMMAND}\n\nFirst lines of the difference:\n{diff}"
        )


def test_every_config_key_is_documented():
    gen = _generator()
    undocumented = [key for key, _, _, doc in iter_fields() if not doc.strip()]
    assert not undocumented, f"config fields without a docstring: {undocumented} (add one under each field)"
    text = gen.render()
    assert all(f"`{key}`" in text for key, *_ in iter_fields())
