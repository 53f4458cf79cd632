"""Prompts: read local files (or an on-disk / hub dataset), build and tokenize prompts, and hand out
batches in a seeded, resumable order.

Reward functions receive each prompt in the form the dataset holds it (plain text or a conversation),
and every other column by name (e.g. ``answer``), as in TRL.

A prompt column may also hold token ids (a list of ints, the pre-tokenized ``input_ids`` of TRL's PPO
scripts): those are the prompt's ids as they are, with no chat template and no decode / re-encode; the
prompt reward functions and logs see is their decoded text, and the column stays a column (the ids as the
policy reads them, after ``data.max_prompt_length``), so a function can score ids.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from slimgrpo.config import DataConfig
from slimgrpo.containers import Prompt, PromptBatch


log = logging.getLogger("slimgrpo")


class DataError(ValueError):
    """Bad dataset: missing file, unreadable row, missing column."""


# ----------------------------------------------------------------------------- reading


# "utf-8-sig" everywhere: Windows editors and Excel save UTF-8 with a byte-order mark, which is not JSON
# (and would otherwise become part of the first CSV column's name).
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8-sig") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{path}: line {lineno} is not valid JSON ({e.msg} at column {e.colno}). "
                    "Each line must hold one JSON object; fix or delete that line."
                ) from None
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {lineno} holds a {type(row).__name__}, expected a JSON object")
            rows.append(row)
    return rows


def _read_json(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8-sig")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return _read_jsonl(path)  # .json files are often JSON lines
    if isinstance(data, dict):  # {"train": [...]} or a column dict
        data = data.get("data", data)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of objects (or JSON lines)")
    for i, row in enumerate(data):
        if not isinstance(row, dict):
            raise DataError(f"{path}: item {i} is a {type(row).__name__}, expected an object")
    return data


def _read_csv(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8-sig", newline="") as f:
        reader = csv.DictReader(f)
        for i, r in enumerate(reader, start=1):
            if None in r or any(v is None for v in r.values()):  # more / fewer fields than the header
                fields = sum(1 for k, v in r.items() if k is not None and v is not None) + len(r.get(None) or [])
                raise DataError(
                    f"{path}: row {i} (line {reader.line_num}) has {fields} fields, the header has "
                    f"{len(reader.fieldnames or [])}: quote values that hold commas (\"a, b\"), or fix that row")
            rows.append(dict(r))
    return rows


def _utf8_error(path: Path) -> DataError:
    """Name the first line that is not UTF-8."""
    for lineno, line in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            return DataError(
                f"{path}: line {lineno} is not valid UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1}): "
                "save the file as UTF-8, e.g. iconv -f latin1 -t utf-8 IN > OUT")
    return DataError(f"{path}: not valid UTF-8: save the file as UTF-8")


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: not a readable Parquet file ({e})") from None


def _read_datasets_folder(path: Path, split: str) -> list[dict[str, Any]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as e:
        raise DataError(f"{path}: not a folder saved with datasets.save_to_disk ({e})") from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{path}: has splits {sorted(ds)}, not {split!r}: set data.split")
        ds = ds[split]
    return ds.to_list()


def _read_hub(name: str, split: str) -> list[dict[str, Any]]:
    import datasets

    try:
        return datasets.load_dataset(name, split=split).to_list()
    except Exception as e:
        raise DataError(
            f"data.path {name!r} is not a local file or folder, and loading it as a hub dataset failed "
            f"({type(e).__name__}: {e}). Check the path, or download the dataset first."
        ) from None


def _rows_in_memory(data: Any, split: str) -> list[dict[str, Any]]:
    if isinstance(data, list):
        bad = next((i for i, row in enumerate(data) if not isinstance(row, dict)), None)
        if bad is not None:
            raise DataError(f"in-memory dataset: row {bad + 1} is a {type(data[bad]).__name__}, not a dict of columns")
        return data
    if isinstance(data, dict):  # a DatasetDict (a dict of splits)
        if split not in data:
            raise DataError(f"in-memory dataset has splits {sorted(data.keys())}, not {split!r}: set data.split")
        data = data[split]
    if hasattr(data, "to_list"):
        return data.to_list()
    raise DataError(f"data.path: expected a file path, a list of row dicts or a datasets.Dataset, got "
                    f"{type(data).__name__}")


READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}


def read_rows(path: Any, split: str = "train") -> list[dict[str, Any]]:
    """All rows of a dataset as dicts. From Python, ``path`` may also be the data itself: a list of row
    dicts, a ``datasets.Dataset`` or a ``DatasetDict`` (``split`` picks the split)."""
    if not isinstance(path, (str, os.PathLike)):
        return _rows_in_memory(path, split)
    p = Path(path)
    if p.is_dir():
        return _read_datasets_folder(p, split)
    if p.is_file():
        reader = READERS.get(p.suffix.lower())
        if reader is None:
            raise DataError(f"{p}: unsupported file type {p.suffix!r}; use .jsonl, .json, .csv or .parquet")
        try:
            return reader(p)
        except UnicodeDecodeError:
            raise _utf8_error(p) from None
    if "/" in path and not path.startswith((".", "/")) and path.count("/") == 1 and not p.suffix:
        return _read_hub(path, split)  # looks like "org/name"
    raise DataError(f"data file {path!r} does not exist (looked in {os.path.abspath(path)})")


# ----------------------------------------------------------------------------- prompts


def is_conversation(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


def row_prompt(row: dict[str, Any], cfg: DataConfig, where: str) -> Prompt:
    """The prompt of one row: from ``prompt_template`` or ``prompt_column``."""
    if cfg.prompt_template is not None:
        try:
            text = cfg.prompt_template.format(**row)
            return as_conversation(text, cfg) if cfg.conversational else text
        except KeyError as e:
            raise DataError(
                f"{where}: data.prompt_template uses column {e.args[0]!r}, which the row lacks "
                f"(columns: {sorted(row)})"
            ) from None
    if cfg.prompt_column not in row:
        hint = ""
        for guess in ("prompt", "question", "problem", "query", "instruction", "input", "messages"):
            if guess in row:
                hint = f" Set data.prompt_column={guess}, or data.prompt_template='...{{{guess}}}...'."
                break
        raise DataError(f"{where}: no column {cfg.prompt_column!r} (columns: {sorted(row)}).{hint}")
    value = row[cfg.prompt_column]
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: column {cfg.prompt_column!r} is empty")
        return as_conversation(value, cfg) if cfg.conversational else value
    if is_conversation(value):
        return value
    raise DataError(
        f"{where}: column {cfg.prompt_column!r} must hold text or a list of "
        f'{{"role": ..., "content": ...}} messages, got {type(value).__name__}'
    )


def _prompt_token_ids(row: dict[str, Any], cfg: DataConfig) -> list[int] | None:
    """The row's prompt as token ids when its prompt column holds them (a list of ints and no
    ``data.prompt_template``), else None."""
    value = row.get(cfg.prompt_column) if cfg.prompt_template is None else None
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, int) and not isinstance(t, bool)
                                                          for t in value):
        return list(value)
    return None


def as_conversation(text: str, cfg: DataConfig) -> list[dict[str, str]]:
    """``data.conversational``: the system prompt (if any) and the text as the user's message."""
    system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
    return system + [{"role": "user", "content": text}]


def extract_answers(rows: list[dict[str, Any]], cfg: DataConfig, source: str) -> list[dict[str, Any]]:
    """``data.answer_from=gsm8k``: ``answer`` becomes the number after ``####`` (solution kept aside)."""
    if cfg.answer_from == "none":
        return rows
    from slimgrpo.rewards.answers import gold_answer

    out = []
    for i, row in enumerate(rows):
        if "answer" not in row:
            raise DataError(f"{source}: row {i + 1}: data.answer_from=gsm8k reads the 'answer' column, which the "
                            f"row lacks (columns: {sorted(row)})")
        text = row["answer"]
        if not isinstance(text, str) or "####" not in text:
            raise DataError(f"{source}: row {i + 1}: data.answer_from=gsm8k expects a worked solution ending in "
                            f"'#### <number>' in 'answer', got {str(text)[:80]!r}")
        out.append({**row, "answer": gold_answer(text), "answer_solution": text})
    return out


def prompt_to_text(prompt: Prompt, tokenizer, cfg: DataConfig) -> tuple[str, bool]:
    """The text the model sees, and whether a chat template produced it (then it already holds the
    special tokens the model expects)."""
    template = cfg.chat_template or getattr(tokenizer, "chat_template", None)
    conversational = not isinstance(prompt, str)
    use = cfg.use_chat_template
    if use == "never" or (use == "auto" and not conversational and not template):
        if conversational:
            return "\n".join(m["content"] for m in prompt), False
        return ((cfg.system_prompt + "\n\n" + prompt) if cfg.system_prompt else prompt), False
    if not template:
        raise DataError(
            "prompts are conversations but the tokenizer has no chat template: set data.chat_template "
            "or data.use_chat_template=never"
        )
    messages = list(prompt) if conversational else [{"role": "user", "content": prompt}]
    if cfg.system_prompt and not any(m["role"] == "system" for m in messages):
        messages = [{"role": "system", "content": cfg.system_prompt}] + messages
    text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True,
                                         **(cfg.chat_template_kwargs or {}))
    return text, True


@dataclass
class PromptDataset:
    """Tokenized prompts with their extra columns."""

    prompts: list[Prompt]
    prompt_ids: list[list[int]]
    columns: dict[str, list[Any]]
    rows: list[int]  # original row index of each kept prompt
    num_truncated: int = 0
    num_skipped: int = 0
    source: str = ""

    def __len__(self) -> int:
        return len(self.prompts)

    def batch(self, indices: list[int]) -> PromptBatch:
        return PromptBatch(
            prompts=[self.prompts[i] for i in indices],
            prompt_ids=[self.prompt_ids[i] for i in indices],
            columns={k: [v[i] for i in indices] for k, v in self.columns.items()},
            indices=[self.rows[i] for i in indices],
        )


def build_dataset(rows: list[dict[str, Any]], tokenizer, cfg: DataConfig, source: str = "data") -> PromptDataset:
    """Build prompts and token ids for every row; bad rows raise DataError naming file and row."""
    if cfg.max_samples is not None:
        rows = rows[: cfg.max_samples]
    if not rows:
        limited = " within data.max_samples" if cfg.max_samples is not None else ""
        raise DataError(f"{source}: the dataset is empty (no rows{limited}): point data.path at a file with "
                        "prompts (for .jsonl, one JSON object per line)")
    rows = extract_answers(rows, cfg, source)
    prompts, ids, kept = [], [], []
    truncated = skipped = 0
    given_ids = _prompt_token_ids(rows[0], cfg) is not None  # the prompt column holds token ids (module docstring)
    for i, row in enumerate(rows):
        where = f"{source}: row {i + 1}"
        if given_ids:
            token_ids = _prompt_token_ids(row, cfg)
            if token_ids is None:
                raise DataError(f"{where}: column {cfg.prompt_column!r} must hold token ids (a list of ints) as "
                                f"row 1 does, got {str(row.get(cfg.prompt_column))[:60]!r}")
        else:
            prompt = row_prompt(row, cfg, where)
            text, templated = prompt_to_text(prompt, tokenizer, cfg)
            # The chat template already carries special tokens; plain text gets the tokenizer's defaults.
            token_ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
        if not token_ids:
            raise DataError(f"{where}: the prompt tokenizes to nothing")
        if len(token_ids) > cfg.max_prompt_length:
            if cfg.prompt_overflow == "error":
                raise DataError(
                    f"{where}: prompt has {len(token_ids)} tokens > data.max_prompt_length="
                    f"{cfg.max_prompt_length}; raise it, or set data.prompt_overflow=truncate|skip"
                )
            if cfg.prompt_overflow == "skip":
                skipped += 1
                continue
            token_ids = token_ids[-cfg.max_prompt_length :]
            truncated += 1
        if given_ids:
            prompt = tokenizer.decode(token_ids, skip_special_tokens=True)
        prompts.append(prompt)
        ids.append(list(token_ids))
        kept.append(i)
    if not prompts:
        raise DataError(
            f"{source}: every prompt is longer than data.max_prompt_length={cfg.max_prompt_length} "
            "and was skipped; raise data.max_prompt_length"
        )
    column_names = [k for k in rows[0] if k != cfg.prompt_column or given_ids]
    columns = {k: [rows[i].get(k) for i in kept] for k in column_names}
    if given_ids:  # the ids as the policy reads them (after data.max_prompt_length)
        columns[cfg.prompt_column] = [list(p) for p in ids]
    return PromptDataset(prompts, ids, columns, kept, truncated, skipped, source)


def load_prompt_dataset(path: Any, tokenizer, cfg: DataConfig) -> PromptDataset:
    rows = read_rows(path, cfg.split)
    if not isinstance(path, (str, os.PathLike)):
        path = "in-memory dataset"
    ds = build_dataset(rows, tokenizer, cfg, source=path)
    log.info("data: %d prompts from %s", len(ds), path)
    if ds.num_truncated:
        log.warning("data: %d prompts longer than data.max_prompt_length=%d were truncated to their last %d tokens "
                    "(data.prompt_overflow=truncate)", ds.num_truncated, cfg.max_prompt_length, cfg.max_prompt_length)
    if ds.num_skipped:
        log.warning("data: %d prompts longer than data.max_prompt_length=%d were skipped (data.prompt_overflow=skip)",
                    ds.num_skipped, cfg.max_prompt_length)
    return ds


# ----------------------------------------------------------------------------- order


def steps_for_epochs(num_train_epochs: float, rows: int, prompts_per_step: int) -> int:
    """Optimizer steps that cover ``num_train_epochs`` passes over ``rows`` prompts (at least 1)."""
    return max(math.ceil(num_train_epochs * rows / prompts_per_step), 1)


def check_enough_prompts(num_prompts: int, prompts_per_step: int, batch_size: int, num_generations: int) -> None:
    """A step draws distinct prompts: fewer than one step needs would repeat prompts within a step."""
    if num_prompts < prompts_per_step:
        fit = num_prompts * num_generations
        raise DataError(
            f"the dataset has {num_prompts} prompt{'s' if num_prompts != 1 else ''}, but each step needs "
            f"{prompts_per_step} (run.batch_size={batch_size} / rollout.num_generations={num_generations}): "
            f"add prompts, or lower run.batch_size to {fit} or less")


@dataclass
class PromptSampler:
    """Seeded epoch-by-epoch order over the dataset, resumable from ``state_dict``.

    Each rank of a distributed run draws ``per_rank`` prompts from the same global order:
    rank k takes positions ``[k*per_rank, (k+1)*per_rank)`` of every global batch.
    """

    size: int
    prompts_per_step: int  # global, across ranks
    seed: int
    shuffle: bool = True
    epoch: int = 0
    cursor: int = 0  # position inside the current epoch's order
    _order: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._order = self._make_order(self.epoch)

    def _make_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.size))
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.size, generator=g).tolist()

    def next_global_batch(self) -> list[int]:
        """The next ``prompts_per_step`` dataset indices (wrapping into the next epoch)."""
        out: list[int] = []
        while len(out) < self.prompts_per_step:
            if self.cursor >= self.size:
                self.epoch += 1
                self.cursor = 0
                self._order = self._make_order(self.epoch)
            take = min(self.prompts_per_step - len(out), self.size - self.cursor)
            out.extend(self._order[self.cursor : self.cursor + take])
            self.cursor += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor, "size": self.size, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("size") != self.size:
            raise DataError(
                f"the checkpoint was made with a dataset of {state.get('size')} prompts, this one has "
                f"{self.size}: resume with the same data (or start a new output_dir)"
            )
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._make_order(self.epoch)
