"""slimgrpo.rewards: reward functions (TRL's contract), their loading, running and the code sandbox.

A reward function is ``fn(prompts, completions, completion_ids=..., **columns) -> list[float | None]``.

    from slimgrpo.rewards import load_reward_functions, RewardRunner
    runner = RewardRunner(load_reward_functions(["gsm8k_accuracy", "format_strict"]), weights=[1.0, 0.2])
    out = runner.score(prompts, completions, completion_ids, {"answer": answers})  # RewardOutput
"""

from slimgrpo.rewards.answers import completion_text, normalize_number, numbers_match, parse_number
from slimgrpo.rewards.builtin import (
    BUILTIN_REWARDS,
    boxed_accuracy,
    code_execution_reward,
    extract_code_block,
    format_lenient,
    format_strict,
    gsm8k_accuracy,
    length_reward,
    make_code_execution_reward,
    make_format_reward,
    make_length_reward,
)
from slimgrpo.rewards.loading import (
    RewardFileNotFoundError,
    RewardSpecError,
    load_reward_function,
    load_reward_functions,
)
from slimgrpo.rewards.scoring import FAULT_KINDS, RewardFunctionError, RewardRunner
from slimgrpo.rewards.sandbox import SandboxLimits, SandboxResult, run_sandboxed

__all__ = [
    "BUILTIN_REWARDS",
    "FAULT_KINDS",
    "RewardFileNotFoundError",
    "RewardFunctionError",
    "RewardRunner",
    "RewardSpecError",
    "SandboxLimits",
    "SandboxResult",
    "boxed_accuracy",
    "code_execution_reward",
    "completion_text",
    "extract_code_block",
    "format_lenient",
    "format_strict",
    "gsm8k_accuracy",
    "length_reward",
    "load_reward_function",
    "load_reward_functions",
    "make_code_execution_reward",
    "make_format_reward",
    "make_length_reward",
    "normalize_number",
    "numbers_match",
    "parse_number",
    "run_sandboxed",
]
