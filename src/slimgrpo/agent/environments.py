"""Tools and environments with TRL 1.16's ``GRPOTrainer`` contract.

* ``tools``: plain functions (sync or async) with type hints and a Google-style docstring; the chat
  template turns them into a JSON schema (``transformers.utils.get_json_schema``).
* ``environment``: a factory (usually a class) returning an environment instance, or a ``{name: factory}``
  mapping chosen per example by its ``environment`` column. Every rollout (each of the G completions of a
  prompt) gets its own instance, drawn from a pool that is reused across steps. The instance must define
  ``reset(**row)``; a string it returns is appended to the last user message. Its public methods other
  than ``reset`` and ``get_reward`` are its tools. A ``get_reward()`` method, when present, is one more
  reward source (weight 1) named after the environment's class.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from slimgrpo.agent.tool_calls import split_tools

ENV_COLUMN = "environment"



def _methods(instance: Any) -> list[Callable]:
    """Public methods of the instance's class (listed on the class so properties are not evaluated)."""
    return [
        getattr(instance, name)
        for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


class Toolbox:
    """Standalone tools plus (optionally) environments, resolved per rollout."""

    def __init__(self, tools: list[Callable] | None = None,
                 environment: Callable | dict[str, Callable] | None = None) -> None:
        self.tools = list(tools or [])
        for fn in self.tools:
            if not callable(fn):
                raise ValueError(f"tools must be callables, got {fn!r}")
        split_tools(self.tools)
        self.multi = isinstance(environment, dict)
        if environment is None:
            self.factories: dict[Any, Callable] | None = None
        elif self.multi:
            if not environment:
                raise ValueError("the environment mapping is empty: give at least one name -> factory")
            self.factories = dict(environment)
        else:
            self.factories = {None: environment}
        self.pool: dict[Any, list[Any]] = {}
        self.reward_types: list[type] = []
        for name, factory in (self.factories or {}).items():
            if not callable(factory):
                raise ValueError(f"environment {name!r}: the factory must be callable, got {factory!r}")
            instance = factory()
            if not callable(getattr(instance, "reset", None)):
                raise ValueError(f"environment {name!r}: each instance returned by the factory must define a "
                                 f"callable reset() ({type(instance).__name__} has none)")
            split_tools(self.tools + _methods(instance))
            self.pool[name] = [instance]
            if callable(getattr(instance, "get_reward", None)) and type(instance) not in self.reward_types:
                self.reward_types.append(type(instance))
        self.environments: list[Any] | None = None  # this step's instances, one per rollout row

    @property
    def enabled(self) -> bool:
        return bool(self.tools) or self.factories is not None

    def assign(self, rows: list[dict[str, Any]]) -> list[str | None]:
        """Hand one environment instance to every rollout row, reset it; returns the text each reset
        added to its prompt (None where it added nothing)."""
        if self.factories is None:
            self.environments = None
            return [None] * len(rows)
        names = []
        for i, row in enumerate(rows):
            name = row.get(ENV_COLUMN) if self.multi else None
            if name not in self.factories:
                raise ValueError(f"rollout row {i}: environment={name!r} is not among the environments "
                                 f"configured in rollout.environment: {sorted(map(str, self.factories))}")
            names.append(name)
        cursor: dict[Any, int] = {}
        self.environments = []
        for name in names:
            pool = self.pool[name]
            k = cursor.get(name, 0)
            if k == len(pool):
                pool.append(self.factories[name]())
            cursor[name] = k + 1
            self.environments.append(pool[k])
        observations = []
        for env, row in zip(self.environments, rows):
            kwargs = {k: v for k, v in row.items() if k != ENV_COLUMN} if self.multi else dict(row)
            obs = env.reset(**kwargs)
            if inspect.isawaitable(obs):
                obs = asyncio.run(_await(obs))
            observations.append(obs)
        return observations

    def row_tools(self, i: int) -> list[Callable]:
        """The tools offered to rollout row ``i`` (standalone tools, then its environment's methods)."""
        if self.environments is None:
            return self.tools
        return self.tools + _methods(self.environments[i])

    def offered_tools(self) -> list[Callable]:
        """Every tool a rollout may be offered: the standalone tools, then the methods of each environment's first
        instance (TRL's ``GRPOTrainer.tools``)."""
        out = list(self.tools)
        for pool in self.pool.values():
            out += [m for m in _methods(pool[0]) if m not in out]
        return out

    def reward_functions(self) -> list[tuple[str, Callable]]:
        """One reward function per environment class with ``get_reward`` (TRL: named after the class)."""
        out = []
        for env_type in self.reward_types:
            def get_reward(environments=None, _env_type=env_type, **kwargs):
                values = []
                for env in environments or []:
                    if type(env) is not _env_type:
                        values.append(None)
                        continue
                    value = env.get_reward()
                    if inspect.isawaitable(value):
                        value = asyncio.run(_await(value))
                    values.append(value)
                return values

            get_reward.__name__ = env_type.__name__
            out.append((env_type.__name__, get_reward))
        return out


async def _await(awaitable):
    return await awaitable


__all__ = ["ENV_COLUMN", "Toolbox"]
