"""From ``rollout.*`` settings (or Python callables) to the trainer's agent pieces.

* ``build_agent``: the ``AgentRollout`` for ``rollout.tools`` / ``rollout.environment``, or None;
* ``CustomRollout``: TRL's ``rollout_func`` contract behind ``rollout.rollout_function``;
* ``sandboxed_call``: runs one tool call in the code sandbox (``rollout.tool_sandbox``);
* ``setup_agent``: the run's ``AgentSetup`` (``train/build.py`` calls it with the parts it reads, not the trainer).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from slimgrpo.config import ConfigError
from slimgrpo.agent.rollout import AgentRollout, AgentSettings
from slimgrpo.agent.environments import Toolbox
from slimgrpo.agent.tool_calls import ToolRunner
from slimgrpo.containers import PromptBatch, Rollout


def load_spec(spec: Any, base_dir: str | None, key: str) -> Callable:
    """A callable as is; ``module:name`` / ``file.py:name`` imported (ConfigError naming ``key`` else)."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"{key}: {spec!r} is not 'package.module:name' or 'path/to/file.py:name'")
    from slimgrpo.rewards.loading import RewardSpecError, load_reward_function

    try:
        return load_reward_function(spec, base_dir)[1]
    except RewardSpecError as e:
        raise ConfigError(f"{key}: {e}") from None


def sandboxed_call(fn: Callable, arguments: dict[str, Any], timeout_s: float | None) -> Any:
    """Run ``fn(**arguments)`` in the code sandbox: the source of ``fn``'s module is executed there, the
    arguments go in and the result comes back as JSON (a result that is not JSON comes back as its str)."""
    from slimgrpo.rewards.sandbox import SandboxLimits, run_sandboxed

    module = inspect.getmodule(fn)
    source = inspect.getsource(module) if module is not None else inspect.getsource(fn)
    name = fn.__name__
    code = (source + "\n\nimport json as _j, sys as _s\n_r = " + name + "(**_j.loads(_s.stdin.read()))\n"
            "try:\n    _out = _j.dumps({'ok': _r})\nexcept TypeError:\n    _out = _j.dumps({'ok': str(_r)})\n"
            "print('\\n' + _out)\n")
    result = run_sandboxed(code, stdin=json.dumps(arguments), limits=SandboxLimits(timeout_s=timeout_s or 30.0))
    if result.timed_out:
        raise TimeoutError(f"timed out after {timeout_s} s")
    if not result.ok:
        tail = (result.stderr.strip().splitlines() or [result.killed_reason or f"exit {result.exit_code}"])[-1]
        raise RuntimeError(tail)
    return json.loads(result.stdout.strip().splitlines()[-1])["ok"]


def build_agent(cfg, engine, tokenizer, tools: list[Callable] | None = None,
                environment: Callable | dict[str, Callable] | None = None) -> AgentRollout | None:
    """The agent rollout for this config, or None when no tool and no environment is configured.
    ``tools`` / ``environment`` (Python API) are used in place of the config's specs when given."""
    r = cfg.rollout
    base = cfg.base_dir
    if tools is None:
        tools = [load_spec(s, base, f"rollout.tools[{i}]") for i, s in enumerate(r.tools)]
    if environment is None and r.environment:
        if isinstance(r.environment, dict):
            environment = {name: load_spec(s, base, f"rollout.environment.{name}") for name, s in r.environment.items()}
        else:
            environment = load_spec(r.environment, base, "rollout.environment")
    if not tools and environment is None:
        return None
    try:
        toolbox = Toolbox(tools, environment)
    except ValueError as e:
        raise ConfigError(f"rollout.tools / rollout.environment: {e}") from None
    template = cfg.data.chat_template or getattr(tokenizer, "chat_template", None)
    if not template:
        raise ConfigError("rollout.tools / rollout.environment need a chat template that renders tools: the "
                          "tokenizer has none; set data.chat_template")
    sandbox = None
    if r.tool_sandbox:
        sandbox = sandboxed_call
        if environment is not None:
            raise ConfigError("rollout.tool_sandbox=true runs stateless tools only: environment methods keep "
                              "state in this process; turn the sandbox off or use plain tools")
    runner = ToolRunner(timeout_s=r.tool_timeout_s, max_output_chars=r.max_tool_output_chars, sandbox=sandbox,
                        max_concurrent=r.max_concurrent_tool_calls)
    settings = AgentSettings(max_iterations=r.max_tool_calling_iterations, tool_call_format=r.tool_call_format,
                             chat_template=cfg.data.chat_template, system_prompt=cfg.data.system_prompt,
                             max_prompt_length=cfg.data.max_prompt_length,
                             chat_template_kwargs=cfg.data.chat_template_kwargs)
    return AgentRollout(engine, tokenizer, toolbox, runner, settings)


class CustomRollout:
    """TRL's ``rollout_func(prompts, trainer) -> dict``: ``prompt_ids``, ``completion_ids`` and
    ``logprobs`` per completion (``num_generations`` per prompt, in prompt order), optional ``env_mask``
    (1 on tokens the model wrote); every other key is passed to the reward functions."""

    def __init__(self, fn: Callable, trainer) -> None:
        self.fn, self.trainer = fn, trainer

    def generate(self, batch: PromptBatch, G: int, params, generator=None) -> Rollout:
        out = self.fn(list(batch.prompts), self.trainer)
        if not isinstance(out, dict):
            raise ValueError(f"rollout.rollout_function returned {type(out).__name__}, expected a dict")
        missing = [k for k in ("prompt_ids", "completion_ids", "logprobs") if k not in out]
        if missing:
            raise ValueError(f"rollout.rollout_function must return keys {missing} in its output dict")
        rows = len(batch.prompts) * G
        pids, cids, lps = out["prompt_ids"], out["completion_ids"], out["logprobs"]
        env_mask = out.get("env_mask")
        for name, v in (("prompt_ids", pids), ("completion_ids", cids), ("logprobs", lps), ("env_mask", env_mask)):
            if v is not None and len(v) != rows:
                raise ValueError(f"rollout.rollout_function: {name} has {len(v)} entries, expected {rows} "
                                 f"({len(batch.prompts)} prompts x num_generations={G})")
        device = generator.device if generator is not None else torch.device("cpu")
        T = max(1, max(len(c) for c in cids))
        comp = torch.full((rows, T), params.pad_token_id, dtype=torch.long)
        cmask = torch.zeros(rows, T, dtype=torch.bool)
        tmask = torch.ones(rows, T, dtype=torch.bool)
        logp = torch.zeros(rows, T, dtype=torch.float32)
        eos = set(params.eos_token_ids)
        for i, c in enumerate(cids):
            k = len(c)
            comp[i, :k] = torch.tensor(list(c), dtype=torch.long)
            cmask[i, :k] = True
            if lps[i] is not None:
                logp[i, :k] = torch.tensor([float(x) for x in lps[i]][:k])
            if env_mask is not None:
                tmask[i, :k] = torch.tensor([bool(x) for x in env_mask[i]][:k])
        P = max(len(p) for p in pids)
        pid = torch.full((rows, P), params.pad_token_id, dtype=torch.long)
        pmask = torch.zeros(rows, P, dtype=torch.bool)
        for i, p in enumerate(pids):
            pid[i, P - len(p):] = torch.tensor(list(p), dtype=torch.long)
            pmask[i, P - len(p):] = True
        extra = {k: list(v) for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs",
                                                                   "env_mask", "logprob_token_ids")}
        truncated = torch.tensor([not c or c[-1] not in eos for c in cids])
        return Rollout(pid.to(device), pmask.to(device), comp.to(device), cmask.to(device), truncated.to(device),
                       logp.to(device), G, tool_mask=tmask.to(device) if env_mask is not None else None,
                       prompts_per_row=True, reward_columns=extra)


@dataclass(frozen=True)
class AgentInputs:
    """The Python API's rollout arguments (TRL's ``GRPOTrainer`` names), used in place of ``rollout.tools`` /
    ``rollout.environment`` / ``rollout.rollout_function`` when given."""

    tools: list[Callable] | None = None
    environment: Callable | dict[str, Callable] | None = None
    rollout_func: Callable | None = None


@dataclass(frozen=True)
class AgentSetup:
    """How a run generates besides the engine: ``agent``, the ``AgentRollout`` for tools / environments, with
    ``rewards`` (one ``get_reward`` reward per environment class); or ``rollout_func``, TRL's
    ``rollout_func(prompts, trainer)``, which the trainer wraps in a ``CustomRollout`` (it receives the
    trainer); or neither (plain rollouts)."""

    agent: AgentRollout | None = None
    rewards: list[tuple[str, Callable]] = field(default_factory=list)
    rollout_func: Callable | None = None


def setup_agent(cfg, dist, engine, tokenizer, given: AgentInputs) -> AgentSetup:
    """The run's ``AgentSetup`` from the config and the Python API's arguments; ``engine`` (the run's, wrapped
    or not) supplies the model parts the agent decodes with, ``dist`` the ranks."""
    fn = given.rollout_func
    if fn is None and cfg.rollout.rollout_function:
        fn = load_spec(cfg.rollout.rollout_function, cfg.base_dir, "rollout.rollout_function")
    if fn is not None:
        return AgentSetup(rollout_func=fn)
    agent = build_agent(cfg, engine, tokenizer, given.tools, given.environment)
    if agent is None:
        return AgentSetup()
    # Under torchrun every rank runs its own rows' conversations and tools with no collective inside; the
    # run wraps the agent like the single-turn engine (distributed/wrap.wrap_engine): guarded with DDP, on
    # gathered weights with FSDP2.
    if dist.enabled and cfg.distributed.strategy == "fsdp" and cfg.distributed.fsdp_generation != "gather":
        # per_layer all-gathers each layer on every forward, and ranks take different numbers of decode
        # steps and turns: their collectives would not pair up (the job hangs until distributed.timeout_s)
        raise ConfigError("rollout.tools / rollout.environment under distributed.strategy=fsdp need "
                          "distributed.fsdp_generation=gather (per_layer gathers every layer on every decode "
                          "step, and ranks decode different numbers of steps and turns)")
    rewards = agent.toolbox.reward_functions()
    if not cfg.rewards.functions and not rewards:
        raise ConfigError("rewards.functions is empty and the environment has no get_reward(): name a reward "
                          "function, or give the environment class a get_reward method")
    return AgentSetup(agent, rewards)


__all__ = ["AgentInputs", "AgentSetup", "CustomRollout", "build_agent", "load_spec", "sandboxed_call", "setup_agent"]
