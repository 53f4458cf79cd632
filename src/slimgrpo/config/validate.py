"""Impossible combinations and derived limits, caught before any model is loaded."""

from __future__ import annotations

from slimgrpo.config.errors import ConfigError
from slimgrpo.config.tree import Config


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
    from slimgrpo.config.eval import validate_eval

    validate_eval(cfg)


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
            f"({max_positions} positions): lower rollout.max_completion_length to at most {room} "
            "or shorten data.max_prompt_length"
        )
