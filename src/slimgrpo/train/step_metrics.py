"""The metrics of one training step, gathered over ranks (``metrics.jsonl``'s keys, TRL's names)."""

from __future__ import annotations

from typing import Any

import torch

from slimgrpo.advantage.estimators import zero_std_fraction
from slimgrpo.rewards.contract import step_means
from slimgrpo.output.metrics import masked_stats, memory_metrics
from slimgrpo.update.batch import stat_sums, token_means
from slimgrpo.update.updater import UpdateResult
from slimgrpo.containers import RewardOutput


def step_metrics(d, device, rollout, rewards: RewardOutput, update: UpdateResult, gen_s: float,
                 step_s: float) -> dict[str, Any]:
    """One step's metrics, the same numbers on every rank: rewards per function, lengths, the loss's token
    means (KL, entropy, clip ratios) weighted by each rank's tokens, timing and peak memory. ``d``: the
    ``DistContext``; ``device``: the policy's."""
    lengths = rollout.model_lengths.float()  # tokens the model wrote (tool results left out)
    gen_tokens = float(d.all_reduce_sum(lengths.sum().reshape(1).to(device)).item())
    m: dict[str, Any] = {}
    all_total = d.all_gather_cat(rewards.total.to(device)).cpu()  # unscorable rows (NaN) left out, as in TRL
    m["reward"], m["reward_std"] = masked_stats(all_total)
    all_per_fn = d.all_gather_cat(rewards.per_function.to(device)).cpu()
    for j, name in enumerate(rewards.names):
        m[f"rewards/{name}/mean"], m[f"rewards/{name}/std"] = masked_stats(all_per_fn[:, j])
        m[f"rewards/{name}/frac_zero_std"] = zero_std_fraction(all_per_fn[:, j], rollout.num_generations)
    m["frac_reward_zero_std"] = zero_std_fraction(all_total, rollout.num_generations)
    all_len = d.all_gather_cat(lengths.to(device)).cpu()
    all_trunc = d.all_gather_cat(rollout.is_truncated.float().to(device)).cpu()
    m["completions/mean_length"] = float(all_len.mean())
    m["completions/min_length"] = float(all_len.min())
    m["completions/max_length"] = float(all_len.max())
    m["completions/clipped_ratio"] = float(all_trunc.mean())
    # Token means of each rank, weighted by its tokens: the same numbers as one process with every row.
    # Clip ratios: means over tokens, or over sequences at importance_sampling_level=sequence (as TRL).
    sums = stat_sums(update.stats)  # the same keys on every rank (extra's depend on the loss type only)
    keys = sorted(sums)
    reduced = d.all_reduce_sum(torch.tensor([sums[k] for k in keys], dtype=torch.float64).to(device))
    r = token_means(dict(zip(keys, reduced.cpu().tolist())))
    m.update({"loss": r.loss, "kl": r.kl, "entropy": r.entropy, "clip_ratio/low_mean": r.clip_ratio_low,
              "clip_ratio/high_mean": r.clip_ratio_high, "clip_ratio/region_mean": r.clip_ratio_region,
              **{k: r.extra[k] for k in sorted(r.extra)}})  # loss: the sum of the ranks' shares
    m["grad_norm"] = update.grad_norm
    if update.entropy_coef is not None:  # after this step's update, as TRL logs it
        m["entropy_coef"] = update.entropy_coef
        m["policy_loss"] = r.policy_loss  # the loss without the entropy bonus (TRL logs it with the bonus on)
    m["learning_rate"] = update.learning_rate
    if update.loss_scale is not None:  # a float16 policy's (update/loss_scale.py), after this step's update
        m["loss_scale"] = update.loss_scale
    m["update_skipped"] = int(update.skipped)
    m["gen/tokens_per_s"] = gen_tokens / max(gen_s, 1e-9)
    m["time/generate_s"] = gen_s
    m["time/step_s"] = step_s
    memory = memory_metrics(device)  # peak allocated (CPU: RSS); on CUDA also reserved and pinned host bytes
    peaks = d.all_reduce_max(torch.tensor(list(memory.values()), dtype=torch.float64, device=device)).tolist()
    m.update(zip(memory, (float(v) for v in peaks)))
    m.update(update.value_metrics)  # PPO: the critic before this step (explained variance, mean value)
    m.update(rollout_metrics(rollout, d))  # tools/... of a multi-turn rollout, over every rank's rows
    for key, count in rewards.fault_counts.items():
        m[f"reward_faults/{key}"] = count
    m.update(step_means(rewards.logged_metrics, d))  # log_metric calls of the reward functions (TRL names)
    return m


def rollout_metrics(rollout, d) -> dict[str, float]:
    """``Rollout.metrics`` (``tools/*``) of the whole job: each rank's are gathered (every rank takes part,
    whatever its rollout) and merged as one rollout of all the rows would report them."""
    if not d.enabled:
        return dict(rollout.metrics)
    from slimgrpo.agent.rollout import merge_tool_metrics

    parts = d.all_gather_object((dict(rollout.metrics), int(rollout.completion_ids.shape[0])))
    return merge_tool_metrics(parts) if any(m for m, _ in parts) else {}


def completion_samples(result, n: int) -> list[dict[str, Any]]:
    """The first ``n`` rows of a step (``StepResult``) for ``completions.jsonl``: prompt, completion, total and
    per-function rewards, advantage, group, and the columns reward functions asked to log (``log_extra``)."""
    G = result.rollout.num_generations
    rewards = result.rewards
    return [{
        "row": i,
        "prompt": result.batch.prompts[i // G],
        "completion": result.completions[i],
        "reward": float(torch.nan_to_num(rewards.total[i], nan=0.0)),  # unscorable (NaN): shown as 0.0
        **{f"reward/{name}": float(rewards.per_function[i, j]) for j, name in enumerate(rewards.names)},
        "advantage": float(result.advantages[i]),
        "group": i // G,
        **{column: values[i] for column, values in rewards.extra_columns.items()},  # log_extra
    } for i in range(min(n, result.rollout.rows))]
