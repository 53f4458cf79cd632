"""The configuration tree: one typed dataclass per pipeline stage.

A config is a YAML file plus dotted ``key=value`` overrides (``loss.beta=0.04``). Every field has a
docstring (the string literal under it), which the docs generator and ``slimgrpo train --help-config``
read. Where TRL's ``GRPOConfig`` has an option with the same meaning we use its name.

Errors in user input raise :class:`ConfigError` with a message that names the key and what to do.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import os
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """Bad configuration: unknown key, wrong type, impossible combination."""


@dataclass
class ModelConfig:
    path: str = ""
    """Hugging Face causal LM: a local folder (config.json + safetensors), or a hub name when online."""
    tokenizer_path: str | None = None
    """Tokenizer folder when it differs from ``model.path``."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weight dtype. ``auto``: bfloat16 on a GPU that supports it, float32 on CPU."""
    trust_remote_code: bool = False
    """Run Python code shipped inside the model folder. Off unless you trust the folder's author."""
    attn_implementation: str | None = "sdpa"
    """Attention kernel passed to transformers (``sdpa``, ``eager``, ``flash_attention_2``)."""
    load_in_4bit: bool = False
    """QLoRA: load the frozen base in 4-bit NF4 through bitsandbytes (CUDA only; needs ``lora.enabled``)."""


@dataclass
class LoraConfig:
    enabled: bool = False
    """Train LoRA adapters through peft instead of all weights. The reference policy is then the base
    model with adapters disabled: no second copy of the weights."""
    r: int = 16
    """LoRA rank."""
    alpha: float = 32.0
    """LoRA scaling numerator (``lora_alpha``); the update is scaled by alpha / r."""
    dropout: float = 0.0
    """Dropout on the LoRA branch."""
    target_modules: list[str] | str = "all-linear"
    """Module names to adapt (e.g. ``[q_proj, v_proj]``) or ``all-linear``."""


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
    chat_template: str | None = None
    """Jinja chat template overriding the tokenizer's own."""
    use_chat_template: Literal["auto", "always", "never"] = "auto"
    """``auto``: apply the chat template to conversational prompts, and to plain prompts when the
    tokenizer has one; ``never``: tokenize text as is."""
    max_prompt_length: int = 512
    """Longest prompt in tokens after the chat template."""
    prompt_overflow: Literal["truncate", "skip", "error"] = "truncate"
    """Longer prompts: keep their last ``max_prompt_length`` tokens, drop them (counted), or stop."""
    shuffle: bool = True
    """Shuffle prompts each epoch (seeded by ``run.seed``)."""
    max_samples: int | None = None
    """Use only the first N rows."""


@dataclass
class RolloutConfig:
    num_generations: int = 8
    """Completions sampled per prompt (the group size)."""
    max_completion_length: int = 256
    """Longest completion in tokens; longer ones are cut and flagged as truncated."""
    min_completion_length: int = 0
    """Suppress EOS before this many tokens (benchmarks pin the work with it)."""
    temperature: float = 1.0
    """Sampling temperature (0 = greedy). The loss uses the same temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off)."""
    min_p: float = 0.0
    """Drop tokens below min_p times the top probability (0 = off)."""
    max_batch_rows: int | None = None
    """Generate at most this many completions at once (bounds KV-cache memory); None = all."""


@dataclass
class RewardsConfig:
    functions: list[str] = field(default_factory=list)
    """Reward functions: built-in names (``gsm8k_accuracy``, ``boxed_accuracy``, ``format_strict``,
    ``format_lenient``, ``length``, ``code_execution``), ``package.module:function``, or
    ``path/to/file.py:function`` (relative to the config file)."""
    reward_weights: list[float] | None = None
    """One weight per function (default all 1.0). The total reward is their weighted sum."""
    on_error: Literal["raise", "zero", "skip"] = "raise"
    """A function that raises or returns bad values: stop, score the row 0, or ignore it (NaN)."""
    timeout_s: float | None = None
    """Per-call time limit of a reward function (None = none)."""
    isolation: Literal["thread", "process"] = "thread"
    """Run reward functions in a worker thread (a call past ``timeout_s`` is abandoned but keeps running)
    or in a forked process that is killed on timeout."""


@dataclass
class LossConfig:
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """Aggregation: grpo = mean per sequence then over sequences; bnpo = mean over the batch's tokens;
    dr_grpo = sum / (sequences x max_completion_length); dapo = mean over all tokens of the global batch."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """Importance ratio per token (GRPO) or per sequence (GSPO)."""
    beta: float = 0.0
    """Weight of the k3 KL penalty to the reference policy (0 = no reference model at all)."""
    epsilon: float = 0.2
    """Lower clipping bound: ratios below 1 - epsilon are clipped."""
    epsilon_high: float | None = None
    """Upper clipping bound (clip-higher, DAPO); None = epsilon."""
    delta: float | None = None
    """Two-sided clipping: cap the unclipped ratio at delta (INTELLECT-2); None = off."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the reward std of the group, of the whole batch, or not at all."""
    advantage_estimator: Literal["grpo", "rloo"] = "grpo"
    """``grpo``: reward minus group mean; ``rloo``: reward minus mean of the other completions."""
    mask_truncated_completions: bool = False
    """Leave completions that hit ``max_completion_length`` out of the loss."""
    num_iterations: int = 1
    """Optimizer steps per generated batch (mu in the GRPO paper); > 1 keeps old log-probs."""
    token_chunk: int | None = None
    """Tokens pushed through the LM head at once when computing log-probs (full logits never exist).
    None = auto: the largest power of two whose fp32 logits chunk stays under 64 MiB (64 tokens for a
    152K vocabulary)."""
    vocab_chunk: int | None = None
    """Also split the vocabulary into chunks of this size (online log-sum-exp); None = whole vocab."""


@dataclass
class MemoryConfig:
    micro_batch_size: int | None = None
    """Completions per forward/backward pass; gradients accumulate over the step. None = all of a step."""
    gradient_checkpointing: bool = False
    """Recompute layer activations in backward instead of keeping them."""
    offload_activations: bool = False
    """Keep checkpointed layer inputs in CPU memory (needs ``gradient_checkpointing``)."""
    optimizer: Literal["adamw", "adamw_8bit"] = "adamw"
    """``adamw_8bit``: bitsandbytes 8-bit AdamW on CUDA, torchao elsewhere when installed."""
    budget: str | None = None
    """Memory budget, e.g. ``16GiB``; ``auto`` = the device's free memory. The run is refused before
    loading the model when the plan does not fit."""
    fit: bool = False
    """When the plan exceeds ``budget``, apply the suggested changes instead of refusing."""


@dataclass
class OptimConfig:
    learning_rate: float = 1e-6
    """Peak learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.99
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    lr_scheduler_type: Literal["constant", "cosine", "linear"] = "constant"
    """Schedule after warmup."""
    warmup_steps: int = 0
    """Linear warmup steps (from 0 to the peak)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (0 = no clipping)."""


@dataclass
class RunConfig:
    output_dir: str = "outputs/run"
    """Run folder (relative to the working directory): metrics.jsonl, summary.json, checkpoints/, the
    final model."""
    max_steps: int = 100
    """Optimizer steps to train (each generates one batch)."""
    batch_size: int = 64
    """Completions per step across all processes (prompts per step x num_generations); must hold whole groups."""
    seed: int = 42
    """Seed for data order, sampling and initialisation."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda``, ``cuda:1``."""
    num_threads: int | None = None
    """CPU threads for torch (None = torch's default)."""
    save_steps: int = 0
    """Write a checkpoint every N steps (0 = only at the end)."""
    save_checkpoints: bool = True
    """Write resumable checkpoints (weights, optimizer, RNG, data position); false = none at all."""
    save_total_limit: int = 2
    """Keep the newest N checkpoints."""
    resume: str = "auto"
    """``auto``: continue from the newest complete checkpoint in output_dir; ``never``; or a path."""
    save_model: bool = True
    """Save the trained model (or adapter) in Hugging Face format at the end."""
    max_nonfinite_steps: int = 3
    """Stop after this many consecutive steps with a NaN/inf loss or gradient (each is skipped)."""


@dataclass
class LogConfig:
    report_to: list[str] | str = "none"
    """Extra metric sinks on top of metrics.jsonl: tensorboard, wandb, trackio, mlflow, none."""
    logging_steps: int = 1
    """Print a metrics line every N steps."""
    log_completions_steps: int = 10
    """Append sample completions (prompt, completion, rewards, advantage) every N steps (0 = never)."""
    num_completions_to_log: int = 4
    """How many completions each time."""
    progress: bool = True
    """Show a progress bar with ETA."""


@dataclass
class DistributedConfig:
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """How the ranks of ``torchrun --nproc_per_node N`` share the model (ignored in a single process).
    ``ddp``: every rank holds the whole model and gradients are all-reduced (LoRA, models that fit one
    device). ``fsdp``: FSDP2 ``fully_shard`` splits weights, gradients and optimizer state over the ranks
    (full fine-tuning of models that do not fit one device); see ``fsdp_generation`` for sampling."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend: ``auto`` = nccl when CUDA is available, gloo on CPU."""
    timeout_s: float = 1800.0
    """Longest a collective may wait for the other ranks before the job fails with a timeout error (a rank
    that hangs or died). Must exceed the longest gap between ranks, e.g. one slow rollout plus rewards."""
    fsdp_generation: Literal["gather", "per_layer"] = "gather"
    """``fsdp`` only: how sampling reads sharded weights. ``gather``: all-gather the whole model once per
    step and free it after the rollout (extra memory: one full copy of the weights). ``per_layer``: every
    layer gathers its weights for each forward and frees them (extra memory ~ one layer plus embeddings
    and LM head; one all-gather per layer per generated token, so much slower)."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA adapters (peft)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling completions."""
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    """Reward functions."""
    loss: LossConfig = field(default_factory=LossConfig)
    """The GRPO-family objective and advantages."""
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    """Memory tricks and the budget."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    run: RunConfig = field(default_factory=RunConfig)
    """Run length, batch, seed, checkpoints."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Multi-process training under torchrun (DDP or FSDP2)."""

    # Folder of the YAML file the config came from; relative paths resolve against it.
    base_dir: str = field(default=".", repr=False, metadata={"internal": True})

    @property
    def prompts_per_step(self) -> int:
        return self.run.batch_size // self.rollout.num_generations

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("base_dir", None)
        return d


# ----------------------------------------------------------------------------- field docs


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings of a dataclass's fields: the string literal right after each annotated field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for prev, node in zip(body, body[1:]):
        if (
            isinstance(prev, ast.AnnAssign)
            and isinstance(prev.target, ast.Name)
            and isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            docs[prev.target.id] = " ".join(node.value.value.split())
    return docs


def iter_fields(cls: type = Config, prefix: str = ""):
    """Yield (dotted_key, type, default, doc) for every leaf field of the tree."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("internal"):
            continue
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from iter_fields(tp, prefix + f.name + ".")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        yield prefix + f.name, tp, default, docs.get(f.name, "")


def type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) if not isinstance(a, str) else a for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list[{type_name(typing.get_args(tp)[0])}]"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


# ----------------------------------------------------------------------------- parsing


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert a YAML value to the annotated type, or raise ConfigError naming the key."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        if type(value) in args:  # "all-linear" for list[str] | str stays a string
            return value
        # Try non-str members first so "3" is not kept as a string when int is allowed.
        for a in sorted((a for a in args if a is not type(None)), key=lambda a: a is str):
            try:
                return _coerce(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: {value!r} is not a {type_name(tp)}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            extra = f" Did you mean {hint[0]!r}?" if hint else ""
            raise ConfigError(f"{key}: {value!r} is not one of {', '.join(map(str, choices))}.{extra}")
        return value
    if origin is list:
        (item,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads "1e-6" as a string
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    raise AssertionError(f"unsupported config type {tp} for {key}")


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping of keys, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if not f.metadata.get("internal")]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(unknown_key_message(prefix + str(key)))
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, prefix + key + ".")
        else:
            kwargs[key] = _coerce(value, tp, prefix + key)
    return cls(**kwargs)


def all_keys() -> list[str]:
    return [k for k, *_ in iter_fields()]


def unknown_key_message(key: str) -> str:
    keys = all_keys()
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    close += [k for k in keys if k.endswith("." + leaf) and k not in close]
    hint = f" Did you mean {' or '.join(repr(c) for c in close[:3])}?" if close else ""
    return f"unknown config key {key!r}.{hint} (`slimgrpo train --help-config` lists every key.)"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``loss.beta=0.04`` -> (["loss", "beta"], 0.04); the value is read as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value (e.g. loss.beta=0.04)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def merge_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {p!r} is a value, not a section")
            node = child
        node[parts[-1]] = value
    return data


def read_yaml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"config file {str(p)!r} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections, got {type(data).__name__}")
    return data


def from_dict(data: dict[str, Any], base_dir: str = ".") -> Config:
    cfg = _build(Config, data, "")
    cfg.base_dir = base_dir
    return cfg


def load_config(path: str | os.PathLike | None, overrides: list[str] = (), validate: bool = True) -> Config:
    """Read a YAML config (or start from defaults when ``path`` is None) and apply overrides."""
    data = read_yaml(path) if path else {}
    data = merge_overrides(data, list(overrides))
    base = str(Path(path).resolve().parent) if path else os.getcwd()
    cfg = from_dict(data, base_dir=base)
    if validate:
        validate_config(cfg)
    return cfg


def resolve_path(cfg: Config, path: str) -> str:
    """A path from the config, relative to the config file's folder; kept as-is when absent there
    and present relative to the working directory (or a hub name)."""
    if not path or os.path.isabs(path):
        return path
    expanded = os.path.expanduser(path)
    if expanded != path:
        return expanded
    candidate = os.path.join(cfg.base_dir, path)
    if os.path.exists(candidate) or not os.path.exists(path):
        return os.path.normpath(candidate) if os.path.exists(candidate) else path
    return path


# ----------------------------------------------------------------------------- validation


def _positive(cfg_value: float, key: str, allow_zero: bool = False) -> None:
    if cfg_value < 0 or (cfg_value == 0 and not allow_zero):
        raise ConfigError(f"{key} must be {'>= 0' if allow_zero else '> 0'}, got {cfg_value}")


def validate_config(cfg: Config) -> None:
    """Impossible combinations, caught before any model is loaded."""
    r, L, run, mem = cfg.rollout, cfg.loss, cfg.run, cfg.memory
    if not cfg.model.path:
        raise ConfigError("model.path is empty: set it to a local model folder (model.path=path/to/model)")
    if not cfg.data.path:
        raise ConfigError("data.path is empty: set it to a prompts file (data.path=prompts.jsonl)")
    if not cfg.rewards.functions:
        raise ConfigError(
            "rewards.functions is empty: name at least one reward function, e.g. "
            "rewards.functions=[gsm8k_accuracy] or rewards.functions=[my_rewards.py:score]"
        )
    if r.num_generations < 2:
        raise ConfigError(
            f"rollout.num_generations={r.num_generations}: GRPO compares completions within a group, "
            "so it needs at least 2 (8 is typical)"
        )
    if run.batch_size % r.num_generations:
        lo = max(r.num_generations, run.batch_size // r.num_generations * r.num_generations)
        raise ConfigError(
            f"run.batch_size={run.batch_size} cannot hold whole groups of rollout.num_generations="
            f"{r.num_generations}: use a multiple of it, e.g. run.batch_size={lo} or {lo + r.num_generations}"
        )
    _positive(run.max_steps, "run.max_steps")
    _positive(r.max_completion_length, "rollout.max_completion_length")
    _positive(cfg.data.max_prompt_length, "data.max_prompt_length")
    if r.min_completion_length > r.max_completion_length:
        raise ConfigError(
            f"rollout.min_completion_length={r.min_completion_length} exceeds "
            f"rollout.max_completion_length={r.max_completion_length}"
        )
    if r.temperature < 0:
        raise ConfigError(f"rollout.temperature must be >= 0, got {r.temperature}")
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {r.top_p}")
    if r.top_k < 0:
        raise ConfigError(f"rollout.top_k must be >= 0 (0 = off), got {r.top_k}")
    if not 0 <= r.min_p < 1:
        raise ConfigError(f"rollout.min_p must be in [0, 1), got {r.min_p}")
    if cfg.rewards.reward_weights is not None and len(cfg.rewards.reward_weights) != len(cfg.rewards.functions):
        raise ConfigError(
            f"rewards.reward_weights has {len(cfg.rewards.reward_weights)} values but rewards.functions "
            f"has {len(cfg.rewards.functions)}: give one weight per function"
        )
    _positive(L.epsilon, "loss.epsilon")
    if L.epsilon_high is not None and L.epsilon_high <= 0:
        raise ConfigError(f"loss.epsilon_high must be > 0, got {L.epsilon_high}")
    if L.delta is not None and L.delta <= 1:
        raise ConfigError(f"loss.delta caps the ratio and must be > 1 (e.g. 2.0), got {L.delta}")
    _positive(L.beta, "loss.beta", allow_zero=True)
    _positive(L.num_iterations, "loss.num_iterations")
    if L.token_chunk is not None:
        _positive(L.token_chunk, "loss.token_chunk")
    if L.vocab_chunk is not None:
        _positive(L.vocab_chunk, "loss.vocab_chunk")
    if mem.micro_batch_size is not None:
        _positive(mem.micro_batch_size, "memory.micro_batch_size")
    if mem.offload_activations and not mem.gradient_checkpointing:
        raise ConfigError(
            "memory.offload_activations needs memory.gradient_checkpointing=true "
            "(only checkpointed layer inputs are offloaded)"
        )
    if cfg.model.load_in_4bit and not cfg.lora.enabled:
        raise ConfigError("model.load_in_4bit (QLoRA) trains adapters only: also set lora.enabled=true")
    _positive(cfg.optim.learning_rate, "optim.learning_rate")
    if run.save_total_limit < 1:
        raise ConfigError(f"run.save_total_limit must be >= 1, got {run.save_total_limit}")
    from slimgrpo.logging_backends import parse_report_to

    try:
        parse_report_to(cfg.log.report_to)
    except ValueError as e:
        raise ConfigError(f"log.report_to: {e}") from None
    if cfg.log.logging_steps < 1:
        raise ConfigError(f"log.logging_steps must be >= 1, got {cfg.log.logging_steps}")
    _positive(cfg.distributed.timeout_s, "distributed.timeout_s")
    if cfg.distributed.strategy == "fsdp" and cfg.lora.enabled:
        raise ConfigError(
            "distributed.strategy=fsdp shards full fine-tuning; LoRA adapters are small, so every rank can hold "
            "the model: use distributed.strategy=ddp with lora.enabled=true"
        )


def auto_token_chunk(vocab_size: int, budget_bytes: int = 64 * 2**20) -> int:
    """Largest power of two of tokens whose fp32 logits chunk [tokens, vocab] fits ``budget_bytes``
    (between 16 and 4096)."""
    tokens = max(budget_bytes // (4 * max(vocab_size, 1)), 1)
    return int(min(max(2 ** (tokens.bit_length() - 1), 16), 4096))


def check_context_length(cfg: Config, max_positions: int | None, model_path: str) -> None:
    """Prompt + completion must fit the model's context (read from config.json before loading weights)."""
    if not max_positions:
        return
    need = cfg.data.max_prompt_length + cfg.rollout.max_completion_length
    if need > max_positions:
        room = max(max_positions - cfg.data.max_prompt_length, 0)
        raise ConfigError(
            f"data.max_prompt_length ({cfg.data.max_prompt_length}) + rollout.max_completion_length "
            f"({cfg.rollout.max_completion_length}) = {need} tokens exceeds the context of {model_path!r} "
            f"({max_positions} positions): lower rollout.max_completion_length to at most {room} "
            "or shorten data.max_prompt_length"
        )


def dump_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config as YAML (secrets scrubbed)."""
    from slimgrpo.secrets import scrub

    Path(path).write_text(yaml.safe_dump(scrub(cfg.to_dict()), sort_keys=False))


def config_to_json(cfg: Config) -> str:
    from slimgrpo.secrets import scrub

    return json.dumps(scrub(cfg.to_dict()), indent=2)
