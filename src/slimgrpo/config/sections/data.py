"""The prompts section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class DataConfig:
    path: str = ""
    """Prompts: a .jsonl/.json, .parquet or .csv file, a folder saved with ``datasets.save_to_disk``,
    or a hub dataset name when the machine is online."""
    split: str = "train"
    """Split to use for folders with several splits and for hub datasets."""
    prompt_column: str = "prompt"
    """Column holding the prompt: plain text or a conversation ``[{"role", "content"}, ...]``."""
    prompt_template: str | None = None
    """Build the prompt from columns instead, e.g. ``"Question: {question}\\nAnswer:"``."""
    system_prompt: str | None = None
    """System message put before each prompt when a chat template is used."""
    conversational: bool = False
    """Turn plain-text prompts (a text column or ``prompt_template``) into conversations: the
    ``system_prompt`` as a system message, then the text as the user's. Completions then arrive as
    ``[{"role": "assistant", "content": ...}]``, as TRL gives them for conversational datasets."""
    answer_from: Literal["none", "gsm8k"] = "none"
    """``gsm8k``: put the number after ``####`` of the ``answer`` column into ``answer`` (the worked
    solution moves to ``answer_solution``), so rewards compare with the bare number."""
    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's own."""
    chat_template_kwargs: dict[str, bool | int | float | str] | None = None
    """Extra variables for the chat template, as TRL's ``chat_template_kwargs`` (``{enable_thinking: false}``
    turns Qwen3's thinking off); passed to every prompt and tool-calling turn the template renders."""
    use_chat_template: Literal["auto", "always", "never"] = "auto"
    """``auto``: apply the chat template to conversational prompts, and to plain prompts when the
    tokenizer has one; ``never``: tokenize text as is."""
    max_prompt_length: int = 512
    """Longest prompt in tokens after the chat template. The memory plan counts every prompt at the longest one
    in ``data.path`` / ``eval.data``, at most this (``slimgrpo plan --no-data``: at this)."""
    prompt_overflow: Literal["truncate", "skip", "error"] = "truncate"
    """Longer prompts: keep their last ``max_prompt_length`` tokens, drop them (counted), or stop."""
    shuffle: bool = True
    """Shuffle prompts each epoch (seeded by ``run.seed``)."""
    max_samples: int | None = None
    """Use only the first N rows."""
