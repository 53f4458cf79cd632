"""Impossible combinations and derived limits, caught before any model is loaded."""

from __future__ import annotations

from slimgrpo.config.errors import ConfigError
from slimgrpo.config.sections.loss import objective_problem
from slimgrpo.config.sections.rollout import vllm_problem
from slimgrpo.config.tree import Config


def _positive(cfg_value: float, key: str, allow_zero: bool = False) -> None:
    if cfg_value < 0 or (cfg_value == 0 and not allow_zero):
        raise ConfigError(f"{key} must be {'>= 0' if allow_zero else '> 0'}, got {cfg_value}")


# attn_implementation values that need a package transformers does not ship: (package, pip name)
_ATTENTION_PACKAGES = {"flash_attention_2": ("flash_attn", "flash-attn"),
                       "flash_attention_3": ("flash_attn_interface", "flash-attn-3 (built from the hopper/ folder)")}


def attention_problem(cfg: Config) -> str | None:
    """Why ``model.attn_implementation`` cannot load here (a package is missing), or None."""
    import importlib.util

    need = _ATTENTION_PACKAGES.get(cfg.model.attn_implementation or "")
    if need is None or importlib.util.find_spec(need[0]) is not None:
        return None
    return (
        f"model.attn_implementation={cfg.model.attn_implementation} needs the {need[0]!r} package, which is not "
        f"installed: pip install {need[1]} (CUDA only), or use model.attn_implementation=sdpa (the default; "
        "PyTorch's fused attention, also memory-efficient)"
    )


def validate_config(cfg: Config, environment_given: bool = False) -> None:
    """Impossible combinations, caught before any model is loaded. ``environment_given``: the Python API passes
    an environment factory (TRL's ``environment_factory``), whose ``get_reward`` may be the only reward (checked
    when the agent is set up, ``agent/setup.py``), as ``rollout.environment`` may."""
    r, L, run, mem = cfg.rollout, cfg.loss, cfg.run, cfg.memory
    if not cfg.model.path:
        raise ConfigError("model.path is empty: set it to a local model folder (model.path=path/to/model)")
    if not cfg.data.path:
        raise ConfigError("data.path is empty: set it to a prompts file (data.path=prompts.jsonl); from Python, "
                          "pass the rows instead: Trainer(cfg, train_dataset=rows) with load_config(..., "
                          "validate=False), or cfg.data.path = rows")
    if not cfg.rewards.functions and not cfg.rollout.environment and not environment_given:
        raise ConfigError(
            "rewards.functions is empty: name at least one reward function, e.g. "
            "rewards.functions=[gsm8k_accuracy] or rewards.functions=[my_rewards.py:score]"
        )
    if r.num_generations < 2 and not cfg.ppo:  # PPO's critic is the baseline: one completion may do
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
    if run.num_train_epochs is not None:
        _positive(run.num_train_epochs, "run.num_train_epochs")
    if not str(run.output_dir).strip():
        raise ConfigError("run.output_dir is empty: give the run its own folder, e.g. run.output_dir=outputs/my-run")
    if run.seed < 0 or run.seed >= 2**32:  # NumPy takes 32 bits; the data order multiplies it by ~1e6 (< 2**64)
        raise ConfigError(f"run.seed must be an integer from 0 to 2**32 - 1, got {run.seed}")
    if run.num_threads is not None and run.num_threads < 1:
        raise ConfigError(f"run.num_threads must be >= 1 (or null for torch's default), got {run.num_threads}")
    _positive(run.max_nonfinite_steps, "run.max_nonfinite_steps")
    _positive(run.max_collapsed_steps, "run.max_collapsed_steps", allow_zero=True)
    if not 0.0 < run.collapse_entropy_ratio <= 1.0:
        raise ConfigError(f"run.collapse_entropy_ratio must be in (0, 1], got {run.collapse_entropy_ratio}")
    if not 0.0 <= run.collapse_grad_norm_min < run.collapse_grad_norm_max:
        raise ConfigError(f"run.collapse_grad_norm_min ({run.collapse_grad_norm_min}) must be >= 0 and below "
                          f"run.collapse_grad_norm_max ({run.collapse_grad_norm_max})")
    _positive(run.stall_steps, "run.stall_steps", allow_zero=True)
    for key in ("stall_zero_std_fraction", "stall_entropy_ratio"):
        if not 0.0 < getattr(run, key) <= 1.0:
            raise ConfigError(f"run.{key} must be in (0, 1], got {getattr(run, key)}")
    if run.stall_reward_flat < 0:
        raise ConfigError(f"run.stall_reward_flat must be >= 0, got {run.stall_reward_flat}")
    if cfg.rewards.timeout_s is not None:
        _positive(cfg.rewards.timeout_s, "rewards.timeout_s")
    _positive(cfg.rewards.max_failed_steps, "rewards.max_failed_steps", allow_zero=True)
    _check_device(run.device)
    if cfg.model.dtype == "float16" and _resolves_to_cpu(run.device):
        raise ConfigError(
            f"model.dtype=float16 with run.device={run.device!r} runs on the CPU, where float16 sampling and "
            "training overflow and fail: use model.dtype=float32 (or bfloat16) on CPU, or run on a GPU")
    _positive(r.max_completion_length, "rollout.max_completion_length")
    _positive(cfg.data.max_prompt_length, "data.max_prompt_length")
    if r.min_completion_length > r.max_completion_length:
        raise ConfigError(
            f"rollout.min_completion_length={r.min_completion_length} exceeds "
            f"rollout.max_completion_length={r.max_completion_length}"
        )
    if r.max_tool_calling_iterations is not None and r.max_tool_calling_iterations < 0:
        raise ConfigError(f"rollout.max_tool_calling_iterations must be >= 0 or null, got "
                          f"{r.max_tool_calling_iterations}")
    if r.tool_timeout_s is not None and not r.tool_timeout_s > 0:
        raise ConfigError(f"rollout.tool_timeout_s must be > 0 or null, got {r.tool_timeout_s}")
    _positive(r.max_tool_output_chars, "rollout.max_tool_output_chars")
    _positive(r.max_concurrent_tool_calls, "rollout.max_concurrent_tool_calls")
    if r.rollout_function and (r.tools or r.environment):
        raise ConfigError("rollout.rollout_function replaces the built-in rollout: it cannot be combined with "
                          "rollout.tools or rollout.environment (call your tools inside the function)")
    problem = vllm_problem(cfg)  # rollout.engine=vllm: installed, on a device and a config it can serve
    if problem:
        raise ConfigError(problem)
    if r.temperature < 0:
        raise ConfigError(f"rollout.temperature must be >= 0, got {r.temperature}")
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p must be in (0, 1], got {r.top_p}")
    if r.top_k < 0:
        raise ConfigError(f"rollout.top_k must be >= 0 (0 = off), got {r.top_k}")
    if not 0 <= r.min_p < 1:
        raise ConfigError(f"rollout.min_p must be in [0, 1), got {r.min_p}")
    if not r.repetition_penalty > 0:
        raise ConfigError(f"rollout.repetition_penalty must be > 0 (1.0 = off), got {r.repetition_penalty}")
    if cfg.rewards.reward_weights is not None and len(cfg.rewards.reward_weights) != len(cfg.rewards.functions):
        raise ConfigError(
            f"rewards.reward_weights has {len(cfg.rewards.reward_weights)} values but rewards.functions "
            f"has {len(cfg.rewards.functions)}: give one weight per function"
        )
    _validate_objective(L, r.max_completion_length)
    _validate_critic(cfg)
    _positive(L.num_iterations, "loss.num_iterations")
    if L.token_chunk is not None:
        _positive(L.token_chunk, "loss.token_chunk")
    if L.vocab_chunk is not None:
        _positive(L.vocab_chunk, "loss.vocab_chunk")
    if mem.micro_batch_size is not None:
        _positive(mem.micro_batch_size, "memory.micro_batch_size")
    if mem.micro_batch_tokens is not None:
        _positive(mem.micro_batch_tokens, "memory.micro_batch_tokens")
    if mem.offload_activations and not mem.gradient_checkpointing:
        raise ConfigError(
            "memory.offload_activations needs memory.gradient_checkpointing=true "
            "(only checkpointed layer inputs are offloaded)"
        )
    if L.sync_ref_model and cfg.lora.enabled:
        raise ConfigError(
            "loss.sync_ref_model=true with lora.enabled=true: the LoRA reference is the base model with adapters "
            "off, which cannot be moved towards the policy without a full copy of the weights (TRL refuses it too); "
            "use full fine-tuning or loss.sync_ref_model=false"
        )
    if run.batch_size % L.steps_per_generation:
        raise ConfigError(f"run.batch_size={run.batch_size} cannot be split into loss.steps_per_generation="
                          f"{L.steps_per_generation} equal optimizer steps: use a multiple of it")
    problem = attention_problem(cfg)
    if problem:
        raise ConfigError(problem)
    if cfg.model.load_in_4bit and not cfg.lora.enabled:
        raise ConfigError("model.load_in_4bit (QLoRA) trains adapters only: also set lora.enabled=true")
    _positive(cfg.optim.learning_rate, "optim.learning_rate")
    _positive(cfg.optim.warmup_steps, "optim.warmup_steps", allow_zero=True)
    if not 0 <= cfg.optim.warmup_ratio < 1:
        raise ConfigError(f"optim.warmup_ratio is a fraction of the steps in [0, 1), got {cfg.optim.warmup_ratio}")
    if cfg.optim.warmup_ratio and cfg.optim.warmup_steps:
        raise ConfigError("set optim.warmup_steps or optim.warmup_ratio, not both (warmup_steps=0.1 is a ratio too)")
    if run.save_total_limit < 1:
        raise ConfigError(f"run.save_total_limit must be >= 1, got {run.save_total_limit}")
    from slimgrpo.config.report_to import parse_report_to

    try:
        parse_report_to(cfg.log.report_to)
    except ValueError as e:
        raise ConfigError(f"log.report_to: {e}") from None
    if cfg.log.logging_steps < 1:
        raise ConfigError(f"log.logging_steps must be >= 1, got {cfg.log.logging_steps}")
    _positive(cfg.distributed.timeout_s, "distributed.timeout_s")
    if cfg.distributed.strategy == "fsdp" and cfg.model.load_in_4bit:
        raise ConfigError(
            "distributed.strategy=fsdp with model.load_in_4bit (QLoRA): FSDP2 shards parameters as DTensors, "
            "which bitsandbytes' packed 4-bit weights are not, and this path is untested here (CUDA only). "
            "Use distributed.strategy=ddp (every rank holds the 4-bit base, ~0.55 GB per billion parameters) "
            "or LoRA on a bf16 base with distributed.strategy=fsdp"
        )
    from slimgrpo.config.precision import bitsandbytes_problem, precision_problem

    problem = precision_problem(cfg, _resolves_to_cpu(run.device)) or bitsandbytes_problem(
        cfg, _resolves_to_cpu(run.device))
    if problem:
        raise ConfigError(problem)
    from slimgrpo.config.best import validate_best
    from slimgrpo.config.sections.eval import validate_eval

    validate_eval(cfg)
    validate_best(cfg)  # run.keep_best / best_metric / early_stopping_*: a metric that judges, checkpoints


def _validate_objective(L, max_completion_length: int | None) -> None:
    """The TRL 1.16 objective options: the loss's own range check (``config.loss.objective_problem``, which
    ``loss.LossSettings`` runs too), then what this tool asks beyond TRL."""
    problem = objective_problem(L, max_completion_length)
    if problem is not None:
        key, what = problem
        raise ConfigError(f"{'rollout' if key == 'max_completion_length' else 'loss'}.{key} {what}")
    if L.loss_type == "cispo" and L.epsilon_high is None:
        raise ConfigError(
            "loss.loss_type=cispo caps the importance ratio at loss.epsilon_high itself (not 1 + epsilon_high): "
            "set it, e.g. loss.epsilon_high=5.0 as in ScaleRL (TRL would silently cap at epsilon=0.2)"
        )
    if L.steps_per_generation < 1:
        raise ConfigError(f"loss.steps_per_generation must be >= 1, got {L.steps_per_generation}")
    if L.use_adaptive_entropy:
        if L.entropy_coef_min > L.entropy_coef_max:
            raise ConfigError(f"loss.entropy_coef_min={L.entropy_coef_min} is above loss.entropy_coef_max="
                              f"{L.entropy_coef_max}: the adaptive coefficient needs min <= max")
        _positive(L.entropy_coef_delta, "loss.entropy_coef_delta", allow_zero=True)
    if L.sync_ref_model:
        if not 0 <= L.ref_model_mixup_alpha <= 1:
            raise ConfigError(f"loss.ref_model_mixup_alpha must be in [0, 1], got {L.ref_model_mixup_alpha}")
        if L.ref_model_sync_steps < 1:
            raise ConfigError(f"loss.ref_model_sync_steps must be >= 1, got {L.ref_model_sync_steps}")
        if L.beta == 0:
            raise ConfigError("loss.sync_ref_model=true with loss.beta=0: there is no reference model to "
                              "synchronize; set loss.beta > 0 (e.g. 0.04) or loss.sync_ref_model=false")
    if L.advantage_estimator == "gae":
        _validate_ppo(L)
    if L.multi_objective_aggregation == "normalize_then_sum" and L.advantage_estimator == "rloo":
        raise ConfigError(
            "loss.multi_objective_aggregation=normalize_then_sum forms advantages itself (per-function group "
            "normalisation, then the batch): it does not combine with loss.advantage_estimator=rloo"
        )


def _validate_ppo(L) -> None:
    """PPO (advantage_estimator=gae): per-token advantages need the token-level clipped surrogate."""
    if L.loss_type not in ("grpo", "bnpo", "dapo", "dr_grpo") or L.importance_sampling_level != "token":
        raise ConfigError(f"loss.advantage_estimator=gae (PPO) takes per-token advantages, which the clipped "
                          f"token-level surrogate uses: set loss.loss_type=dapo (TRL PPO's token mean) and "
                          f"loss.importance_sampling_level=token (got {L.loss_type}, {L.importance_sampling_level})")
    if L.multi_objective_aggregation != "sum_then_normalize":
        raise ConfigError("loss.advantage_estimator=gae scores each completion with the weighted sum of the "
                          "reward functions: keep loss.multi_objective_aggregation=sum_then_normalize")
    if not (0 <= L.gamma <= 1 and 0 <= L.lam <= 1):
        raise ConfigError(f"loss.gamma and loss.lam must be in [0, 1], got {L.gamma} and {L.lam}")
    _positive(L.kl_coef, "loss.kl_coef", allow_zero=True)


def _validate_critic(cfg: Config) -> None:
    c = cfg.critic
    _positive(c.vf_coef, "critic.vf_coef", allow_zero=True)
    _positive(c.cliprange_value, "critic.cliprange_value")
    if cfg.ppo and cfg.lora.enabled and c.model_path is not None:
        raise ConfigError("critic.model_path is for full fine-tuning: with LoRA the critic is a second adapter "
                          "on the policy's base model; leave critic.model_path unset")


def loss_warnings(cfg: Config) -> list[str]:
    """Legal but probably unintended objective settings; TRL 1.16 warns about the same ones."""
    L, out = cfg.loss, []
    if L.importance_sampling_level == "sequence" and L.loss_type in ("bnpo", "dr_grpo", "dapo", "cispo"):
        out.append(
            f"loss.importance_sampling_level=sequence with loss.loss_type={L.loss_type}: this loss sums per-token "
            "contributions, which weights each sequence by its completion length instead of optimising the "
            "per-sequence objective. To reproduce the GSPO paper's setup, set loss.loss_type=grpo."
        )
    if L.loss_type == "luspo" and L.importance_sampling_level != "sequence":
        out.append("loss.loss_type=luspo: set loss.importance_sampling_level=sequence to mirror the paper's setup.")
    if L.loss_type == "vespo" and L.importance_sampling_level != "token":
        out.append("loss.loss_type=vespo computes sequence-level weights itself: "
                   "loss.importance_sampling_level should stay token (the default).")
    return out


def _check_device(device: str) -> None:
    """``run.device``: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` with N a device this machine has (checked
    where CUDA is visible; without it, loading refuses any cuda device with its own message)."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        if device == "auto":
            return
        raise ConfigError(f"run.device={device!r} is not a device: use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and dev.index is not None and torch.cuda.is_available():
        count = torch.cuda.device_count()
        if dev.index >= count:
            raise ConfigError(f"run.device={device!r} but this machine has {count} CUDA device(s) (cuda:0 to "
                              f"cuda:{count - 1}); use one of those, or run.device=auto")


def _resolves_to_cpu(device: str) -> bool:
    if device == "cpu":
        return True
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return False


def check_context_length(cfg: Config, max_positions: int | None, model_path: str) -> None:
    """Prompt + completion must fit the model's context (read from config.json before loading weights)."""
    if not max_positions:
        return
    need = cfg.data.max_prompt_length + cfg.rollout.max_completion_length
    if need > max_positions:
        room = max_positions - cfg.data.max_prompt_length
        if room < 1:  # no completion length can help: the prompt budget alone fills the context
            raise ConfigError(
                f"data.max_prompt_length ({cfg.data.max_prompt_length}) alone reaches the context of "
                f"{model_path!r} ({max_positions} positions), leaving no room for a completion: lower "
                f"data.max_prompt_length below {max_positions} (e.g. {max_positions // 2}) so that prompt + "
                f"rollout.max_completion_length ({cfg.rollout.max_completion_length}) fits"
            )
        raise ConfigError(
            f"data.max_prompt_length ({cfg.data.max_prompt_length}) + rollout.max_completion_length "
            f"({cfg.rollout.max_completion_length}) = {need} tokens exceeds the context of {model_path!r} "
            f"({max_positions} positions, its position limit after rope scaling): lower "
            f"rollout.max_completion_length to at most {room} "
            "or shorten data.max_prompt_length"
        )
