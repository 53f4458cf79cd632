"""Which memory tricks a plan assumed, and where each was decided: the config as set, or an ``auto`` rule of the
planner (the run applies the same rules, so the plan and the run take the same path). ``render_plan`` prints
them under the table, so a user reads off the plan what the run will do, not only how much it will hold.

    for line in assumed_tricks(plan):  "tiled MLP: on (memory.tiled_mlp=auto: 69,632 tokens per MLP call ...)"
"""

from __future__ import annotations

import dataclasses

from slimgrpo.plan.formulas import TILED_MLP_AUTO_TOKENS, TILED_MLP_MIN_GAIN, _n
from slimgrpo.plan.types import MemoryPlan


def assumed_tricks(plan: MemoryPlan) -> list[str]:
    """One line per memory trick: its state in this plan and the rule or key that set it."""
    from slimgrpo.plan.planner import (decode_packing, plan_memory, shared_prompt_groups, shared_prompt_lighter_without_grad,
                          tiled_mlp_on)

    shape, x = plan.shape, plan.inputs
    out = [f"gradient checkpointing: {_on(x.gradient_checkpointing)} (memory.gradient_checkpointing)"]
    if x.device == "cuda":
        out.append(f"activation offload to host RAM: {_on(x.offload_activations)} (memory.offload_activations"
                   + (", needs checkpointing)" if x.offload_activations or not x.gradient_checkpointing else ")"))
    tiled = tiled_mlp_on(shape, x)
    if x.tiled_mlp == "auto":
        tokens = x.micro_rows * x.seq_len
        if tokens < TILED_MLP_AUTO_TOKENS:
            why = f"{_n(tokens)} tokens per MLP call, under {_n(TILED_MLP_AUTO_TOKENS)}"
        else:
            off = plan_memory(shape, dataclasses.replace(x, tiled_mlp="off")).peak_bytes
            on = plan_memory(shape, dataclasses.replace(x, tiled_mlp="on")).peak_bytes
            why = (f"{_n(tokens)} tokens per MLP call, at least {_n(TILED_MLP_AUTO_TOKENS)}; tiled the plan's peak is "
                   f"{(off - on) / max(off, 1):.0%} lower, {'at least' if tiled else 'under'} {TILED_MLP_MIN_GAIN:.0%}")
        out.append(f"tiled MLP: {_on(tiled)} (memory.tiled_mlp=auto: {why})")
    else:
        out.append(f"tiled MLP: {_on(tiled)} (memory.tiled_mlp={x.tiled_mlp})")
    groups = shared_prompt_groups(x, shape)
    if not x.share_prompt_forward:
        layout = "unpadded rows (memory.share_prompt_forward=false)"
    elif groups:
        layout = (f"each group's prompt once, {groups} group(s) per micro-batch (memory.share_prompt_forward: it keeps "
                  "fewer bytes than unpadded rows)")
    elif x.gradient_checkpointing:
        layout = "unpadded rows (memory.share_prompt_forward needs checkpointing off)"
    else:
        layout = ("unpadded rows (memory.share_prompt_forward: sharing would keep more, or no two rows of a micro-batch "
                  "share a prompt)")
    out.append(f"update layout: {layout}; packed rows (short real lengths) are not planned: an upper bound")
    if x.needs_reference or x.num_iterations > 1 or x.ppo:
        g = max(1, -(-x.micro_rows // max(x.num_generations, 1)))
        shared = x.share_prompt_forward and shared_prompt_lighter_without_grad(shape, x, g)
        out.append(f"reference / old log-prob passes: {'prompt once per group' if shared else 'unpadded rows'} "
                   "(no gradient: shared only where it holds no more than unpadded rows)")
    out.append(f"micro-batches: {x.micro_rows} of {x.rows} rows (memory.micro_batch_size"
               + (", memory.micro_batch_tokens)" if x.micro_batch_tokens else ")"))
    out.append(f"loss: chunked LM head, {_n(x.token_chunk)} tokens x {_n(x.vocab_chunk or shape.vocab)} vocabulary "
               "per chunk (loss.token_chunk, auto from the vocabulary; loss.vocab_chunk)")
    out.append(f"optimizer: {'8-bit AdamW' if x.optimizer == 'adamw_8bit' else 'AdamW'} (memory.optimizer)")
    if x.rollout_engine == "vllm":
        sleep = ", sleep mode between rollouts" if x.device == "cuda" and x.vllm_sleep else ""
        out.append(f"rollout engine: vLLM, colocated{sleep} (rollout.engine; plan/vllm.py)")
    elif x.device == "cpu":
        packing = decode_packing(shape, x)
        rule = "auto: " if x.decode_packing == "auto" else ""
        out.append(f"decode weights packed: {packing} ({rule}rollout packing rule, planner.decode_packing)")
    if x.kv_cache_dtype != "auto":
        out.append(f"KV cache: {x.kv_cache_dtype} (rollout.kv_cache_dtype)")
    return out


def _on(flag: bool) -> str:
    return "on" if flag else "off"
