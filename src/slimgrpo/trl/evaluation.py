"""TRL's datasets as a script hands them to ``GRPOTrainer``, for slimgrpo's run: a streamed training set read
up to what ``max_steps`` uses, evaluation sets given one by one or by name (a ``dict`` / ``DatasetDict``, whose
metrics TRL names ``eval_<name>_...``), and ``evaluate(eval_dataset=...)`` on a set given at the call.

slimgrpo's evaluation is its own (greedy and sampled accuracy, pass@k, the mean reward and each reward
function's: ``evaluate/during.py``); it has no loss, so TRL's ``eval_loss`` has no counterpart
(docs/trl-migration.md).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

__all__ = ["NamedEvals", "eval_sets", "evaluators_for", "prompt_rows", "streamed_train_rows", "union_rows"]


def _is_iterable_dataset(data: Any) -> bool:
    from datasets import IterableDataset

    return isinstance(data, IterableDataset)


def prompt_rows(data: Any) -> Any:
    """``data`` as slimgrpo's loader reads it: a streamed ``datasets.IterableDataset`` read whole (an evaluation
    set), anything else as it is."""
    return [dict(row) for row in data] if _is_iterable_dataset(data) else data


def streamed_train_rows(data: Any, args: Any) -> Any:
    """A streamed training set (``IterableDataset``) read up to the prompts ``max_steps`` generated batches take
    (as TRL streams it; it requires ``max_steps``, as transformers does); any other set as it is."""
    if not _is_iterable_dataset(data):
        return data
    if args.max_steps <= 0:
        raise ValueError("The train_dataset does not implement __len__ (a streamed IterableDataset): max_steps has "
                         "to be specified (GRPOConfig(max_steps=...))")
    prompts = args.max_steps * max(1, args.generation_batch_size // args.num_generations)
    return [dict(row) for row in itertools.islice(data, prompts)]


def eval_sets(eval_dataset: Any) -> dict[str | None, Any]:
    """TRL's ``eval_dataset``: None -> no set; a dict or ``DatasetDict`` -> its named sets; else one set (name
    None). Streamed sets are read whole."""
    if eval_dataset is None:
        return {}
    if isinstance(eval_dataset, dict):  # DatasetDict and IterableDatasetDict are dicts
        return {str(name): prompt_rows(ds) for name, ds in eval_dataset.items()}
    return {None: prompt_rows(eval_dataset)}


def union_rows(sets: dict[str | None, Any]) -> Any:
    """What the run's ``eval.data`` holds: the one set, or every named set's rows together (the memory plan
    counts the longest prompt of them all; ``NamedEvals`` then evaluates each on its own)."""
    if list(sets) == [None]:
        return sets[None]
    return [dict(row) for ds in sets.values() for row in ds]


class NamedEvals:
    """Several named evaluation sets evaluated as the run's one evaluator (``DuringTrainingEval``'s interface:
    ``num_prompts``, ``due``, ``after_step``, ``run``): each set's ``eval/<metric>`` as ``eval/<name>/<metric>``,
    which ``GRPOTrainer`` logs as TRL's ``eval_<name>_<metric>``."""

    def __init__(self, evaluators: dict[str, Any]):
        self.evaluators = evaluators
        self.num_prompts = sum(ev.num_prompts for ev in evaluators.values())

    def due(self, step: int) -> bool:
        return next(iter(self.evaluators.values())).due(step)

    def after_step(self, step: int) -> dict[str, float]:
        return self.run() if self.due(step) else {}

    def run(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, ev in self.evaluators.items():
            for key, value in ev.run().items():
                if key.startswith("eval/"):
                    out[f"eval/{name}/" + key.removeprefix("eval/")] = value
                else:
                    out[key] = out.get(key, 0.0) + value  # time/eval_s: all the sets' time
        return out


def evaluators_for(loop: Any, agent: Any, sets: dict[str | None, Any]) -> Any:
    """The evaluator of ``sets`` (``eval_sets``'s) on the run of ``loop`` with its tokenizer, the run's data
    settings and ``eval.max_prompts``: one ``DuringTrainingEval``, or ``NamedEvals`` over named sets.
    ``agent``: the run's multi-turn rollout for tools / environments, else None."""
    from slimgrpo.data import load_prompt_dataset
    from slimgrpo.evaluate.during import DuringTrainingEval

    cfg = loop.cfg
    first = dataclasses.replace(cfg.data, max_samples=cfg.eval.max_prompts)

    def one(rows: Any) -> DuringTrainingEval:
        dataset = load_prompt_dataset(rows, loop.policy.tokenizer, first)
        return DuringTrainingEval(cfg, loop.dist, loop.policy, loop.reward_runner, loop.engine, agent,
                                  loop.sampling, dataset)

    if list(sets) == [None]:
        return one(sets[None])
    return NamedEvals({name: one(rows) for name, rows in sets.items()})
