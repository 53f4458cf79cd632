"""Rollout engines: turn a batch of prompts into ``num_generations`` sampled completions each.

``RolloutEngine`` is the interface the trainer talks to; an external server (vLLM, SGLang) can
implement it later. ``TorchRolloutEngine`` generates with the trainer's own live model -- no weight
copy and nothing to synchronise after an optimizer step -- and is built for the cost profile of GRPO:

* each prompt is prefilled once, ``prefill_chunk`` positions at a time (a bounded working set at any
  prompt length), then its KV cache is fanned out to the G rows of its group;
* every decode step runs the decoder on one new token per row and the LM head on that position only;
  Llama-shaped models use a lean step with a preallocated KV buffer (``decode.LlamaStepper``),
  others the model's own forward; on CPU the LM head weight (optionally every linear layer) is
  packed for oneDNN once per call;
* sampling is inverse-CDF (``sampling.sample_next``), never ``multinomial`` over the vocabulary;
* rows stop at EOS; finished rows are fed padding until enough of them pile up, then they are dropped
  from the batch (and from the KV cache) so later steps get cheaper; the loop ends when all are done.

The code is device-agnostic (everything lives on the model's device). A decode step waits for the device
once, to learn how many rows have finished (none when there is no EOS); ending rows are recorded on the
device. With ``SLIMGRPO_CUDA_GRAPHS=1`` on CUDA, Llama-shaped models decode through recorded CUDA graphs that
the engine keeps across calls (``graph_cache``; rollout/cuda_graph.py, rollout/graph_cache.py). It has been
run on CPU only so far.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import nn
from transformers import DynamicCache

from slimgrpo.collectives import Collectives
from slimgrpo.memory.malloc import generation_heap, mapped
from slimgrpo.rollout.costs import DECODE_PACK_MIN_BYTES, PREFILL_CHUNK_TOKENS
from slimgrpo.containers import Rollout
from slimgrpo.forward.gather import select_cache_rows
from . import cuda_graph
from .decode import make_stepper
from .graph_cache import GraphCache
from .llama_stepper import LlamaStepper
from .model_parts import CausalLMParts, eval_mode
from .sampling import SamplingParams, SamplingWorkspace, apply_repetition_penalty, sample_next


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that can sample ``num_generations`` completions for each prompt. ``off_policy``: its samples
    come from another copy of the weights (vLLM), so the trainer corrects for the sampler; ``metrics``: this
    step's figures of the engine for metrics.jsonl; ``close()``: free what it holds at the end of a run."""

    off_policy: bool

    @property
    def metrics(self) -> dict[str, float]: ...

    def close(self) -> None: ...

    def generate(
        self,
        prompt_ids: list[list[int]],
        num_generations: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Sample completions; row ``r`` of the result belongs to prompt ``r // num_generations``."""
        ...


class TorchRolloutEngine:
    """Batched KV-cached generation over a live Hugging Face causal LM (optionally peft-wrapped).

    Args:
        model: the trainer's model: a ``transformers`` causal LM or a ``peft.PeftModel`` (active
            adapters are used), or its ``CausalLMParts`` (a memory trace makes them with its simulated
            ``DeviceTarget``: ``slimgrpo/target.py``). Its train/eval mode is restored after every call.
        max_batch_rows: most rows decoded at once (bounds KV-cache memory); ``None`` = all rows.
            Rows are split in group order; a chunk prefills only the prompts it needs.
        drop_finished_fraction: finished rows stay in the batch (fed padding) until they make up this
            fraction of it, then the batch and its KV cache are compacted. 0 drops them at once.
        pack_weights: which float32 CPU weights to pack for oneDNN during each call: ``"head"`` the LM
            head, ``"all"`` also the decoder's linear layers, q/k/v and gate/up stacked (one more copy of
            the decoder weights while generating), ``"none"`` nothing (and no LoRA merge); ``"auto"`` is
            ``"all"`` where the lean stepper decodes and the projections hold at least 64 MiB, ``"head"``
            elsewhere (``_packing``). A run passes its resolved spec's choice (``spec.decode_packing``, decided by
            the planner: ``plan.model.decode_packing``).
            See ``CausalLMParts.packed_weights``.
        lean_decode: run decode steps through ``decode.LlamaStepper`` (Llama/Qwen2/Qwen3/Mistral
            without sliding windows) instead of the model's own forward. ``None`` = where supported,
            ``False`` = never, ``True`` = always (ValueError if the model is not supported).
        prefill_chunk: prompts are prefilled this many positions at a time (each chunk attends to the
            cache of the ones before), so the prefill's working set is one chunk's, whatever the prompt
            length; ``None`` = the whole prompt in one piece. Default ``PREFILL_CHUNK_TOKENS`` (2,048), which
            the planner's ``prefill working set`` line assumes.
        agree_over: the ranks to agree with when every decoder forward is a collective (FSDP2 with
            ``fsdp_generation=per_layer``, distributed/wrap.py): prompts are left-padded to the widest rank's
            (the same prefill chunks) and decoding goes on, feeding padding, until every rank is done.
            ``None`` (one process, DDP, gathered weights): each rank decodes on its own.
    """

    def __init__(
        self,
        model: nn.Module | CausalLMParts,
        *,
        max_batch_rows: int | None = None,
        drop_finished_fraction: float = 0.25,
        pack_weights: str = "auto",
        lean_decode: bool | None = None,
        kv_cache_dtype: str | None = None,
        prefill_chunk: int | None = PREFILL_CHUNK_TOKENS,
        agree_over: Collectives | None = None,
    ) -> None:
        if max_batch_rows is not None and (not isinstance(max_batch_rows, int) or max_batch_rows < 1):
            raise ValueError(f"max_batch_rows must be a positive int or None, got {max_batch_rows!r}")
        if not 0.0 <= drop_finished_fraction <= 1.0:
            raise ValueError(f"drop_finished_fraction must be in [0, 1], got {drop_finished_fraction}")
        self.parts = model if isinstance(model, CausalLMParts) else CausalLMParts(model)
        self.max_batch_rows = max_batch_rows
        self.drop_finished_fraction = drop_finished_fraction
        if pack_weights not in ("auto", "head", "all", "none"):
            raise ValueError(f"pack_weights must be 'auto', 'head', 'all' or 'none', got {pack_weights!r}")
        self.pack_weights = pack_weights
        self.lean_decode = lean_decode
        self.kv_cache_dtype = kv_cache_dtype  # None/"auto" = model dtype; "fp8_e4m3" / "int8": rollout/kv_quant.py
        if prefill_chunk is not None and (not isinstance(prefill_chunk, int) or prefill_chunk < 1):
            raise ValueError(f"prefill_chunk must be a positive int or None, got {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk
        # FSDP2 with per-layer gathering: every forward is a collective, so the ranks run the same number of them
        self.agree_over = agree_over
        # The static decode tensors and CUDA graphs kept from call to call (rollout/graph_cache.py): made on the
        # first CUDA call while ``cuda_graph.enabled``; set one to choose (tests pass a stand-in recorder);
        # ``graph_cache.release()`` frees its memory.
        self.graph_cache: GraphCache | None = None

    off_policy = False  # the live weights: nothing to correct for (``RolloutEngine``)

    @property
    def metrics(self) -> dict[str, float]:
        """No per-step figures of its own (``RolloutEngine``): generation is timed by the trainer."""
        return {}

    def close(self) -> None:
        """Nothing to free at the end of a run (``RolloutEngine``): the engine holds no weights of its own."""

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompt_ids: list[list[int]],
        num_generations: int,
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Sample ``num_generations`` completions for each prompt (see ``RolloutEngine``)."""
        _check_prompts(prompt_ids)
        if not isinstance(num_generations, int) or num_generations < 1:
            raise ValueError(f"num_generations must be a positive int, got {num_generations!r}")
        G = num_generations
        rows = len(prompt_ids) * G
        device = self.parts.device
        chunk_rows = rows if self.max_batch_rows is None else min(rows, self.max_batch_rows)

        pieces = []
        packed = self.parts.packed_weights(chunk_rows, self._packing(prompt_ids, params))
        with torch.no_grad(), eval_mode(self.parts.root), packed:
            # no_grad rather than inference_mode: the returned ids feed the training forward later, and
            # inference tensors cannot be saved for backward.
            for start in range(0, rows, chunk_rows):
                row_prompt = torch.arange(start, min(start + chunk_rows, rows)) // G  # [chunk] prompt index
                pieces.append(self._generate_chunk(prompt_ids, row_prompt, params, generator, device))

        T = max(int(p[2].max()) for p in pieces)  # longest completion over all rows
        completion_ids = torch.cat([p[0][:, :T] for p in pieces])  # [rows, T]
        sampler_logprobs = torch.cat([p[1][:, :T] for p in pieces])  # [rows, T]
        lengths = torch.cat([p[2] for p in pieces])  # [rows]
        is_truncated = torch.cat([p[3] for p in pieces])  # [rows]
        completion_mask = torch.arange(T, device=device)[None, :] < lengths[:, None]  # [rows, T]
        prompt_tensor, prompt_mask = left_pad(prompt_ids, params.pad_token_id, device)
        return Rollout(
            prompt_ids=prompt_tensor,
            prompt_mask=prompt_mask,
            completion_ids=completion_ids,
            completion_mask=completion_mask,
            is_truncated=is_truncated,
            sampler_logprobs=sampler_logprobs,
            num_generations=G,
        )

    def _packing(self, prompt_ids: list[list[int]], params: SamplingParams) -> str:
        """``pack_weights`` for this call: ``"auto"`` packs every decoder weight (``"all"``) where the lean
        stepper decodes, whose products go through them, and the projections hold at least
        ``DECODE_PACK_MIN_BYTES``; elsewhere the head only (the model's own forward would not use packed
        decoder weights; a tiny model's would cost more in oneDNN's kernel cache than they hold)."""
        if self.pack_weights != "auto":
            return self.pack_weights
        total = max(len(p) for p in prompt_ids) + params.max_new_tokens
        projections = sum(m.weight.numel() * 4 for m in self.parts.decoder.modules() if type(m) is nn.Linear)
        if (self.lean_decode is not False and projections >= DECODE_PACK_MIN_BYTES
                and LlamaStepper.supports(self.parts, total)):
            return "all"
        return "head"

    # ------------------------------------------------------------------ one chunk of rows
    def _generate_chunk(
        self,
        prompt_ids: list[list[int]],
        row_prompt: torch.Tensor,
        params: SamplingParams,
        generator: torch.Generator | None,
        device: torch.device,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Generate for the rows whose prompt indices are ``row_prompt`` ([n] long, non-decreasing).

        Returns ``(tokens [n, max_new], logprobs [n, max_new], lengths [n], is_truncated [n])``.
        """
        prompt_order, row_slot = torch.unique_consecutive(row_prompt, return_inverse=True)
        ids, mask = left_pad([prompt_ids[i] for i in prompt_order.tolist()], params.pad_token_id, device)
        if self.agree_over is not None:  # the same prefill chunks on every rank
            extra = self.agree_over.max_over_ranks(ids.shape[1]) - ids.shape[1]
            ids = torch.cat([ids.new_full((ids.shape[0], extra), params.pad_token_id), ids], dim=1)
            mask = torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1)
        n, max_new = row_prompt.numel(), params.max_new_tokens
        row_slot = row_slot.to(device)  # [n] which prefilled prompt each row extends

        # Prefill each distinct prompt once (batch = prompts), left padding handled by mask + positions.
        cache = DynamicCache(config=self.parts.config)
        hidden = self._prefill(ids, mask, cache)  # [p, H]
        logits = self.parts.logits(hidden)[row_slot]  # [n, V]
        # Fan the prompt's KV cache out to its rows (rows of one prompt are adjacent).
        select_cache_rows(cache, row_slot)

        stepper = make_stepper(self.parts, cache, mask[row_slot], max_new, self.lean_decode, self.kv_cache_dtype,
                               graphs=self._graphs(device))
        del cache  # the stepper holds what it needs

        # Step-major outputs: each step writes one contiguous row (index_copy_), transposed at the end.
        out_tokens = torch.full((max_new, n), params.pad_token_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros(max_new, n, dtype=torch.float32, device=device)
        lengths = torch.full((n,), max_new, dtype=torch.long, device=device)
        ended = torch.zeros(n, dtype=torch.bool, device=device)  # [n] produced an EOS
        seen = None  # [b, V] bool: tokens in each row so far (repetition_penalty only)
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(logits.shape, dtype=torch.bool, device=device)
            r, c = mask[row_slot].bool().nonzero(as_tuple=True)  # left padding is not a token of the row
            seen[r, ids[row_slot][r, c]] = True

        # Everything above is allocated once per call, under the pinned mmap threshold; only the decode loop's
        # per-step tensors come from glibc's heap (memory/malloc.py).
        handed = [logits]  # _decode takes the prefill's logits over: held here, they would live through every step
        del logits
        with generation_heap():
            self._decode(stepper, handed, seen, params, generator, (out_tokens, out_logprobs, lengths, ended))
        return out_tokens.t().contiguous(), out_logprobs.t().contiguous(), lengths, ~ended

    def _decode(self, stepper, handed: list[torch.Tensor], seen: torch.Tensor | None, params: SamplingParams,
                generator: torch.Generator | None, outputs: tuple[torch.Tensor, ...]) -> None:
        """Sample up to ``max_new_tokens`` per row from the prefill's logits [n, V] on (``handed``: a one-item list,
        emptied here so that only this frame holds them), writing ``outputs`` (step-major tokens and log-probs,
        lengths, ended) in place; rows leave the batch as they finish. A step's logits are dropped once sampled,
        before the next step's are formed: one [b, V] float32 block at a time (plus the sampling workspace and, in
        16-bit, the head's output), as the planner counts them (``generation logits``)."""
        logits = handed.pop()
        out_tokens, out_logprobs, lengths, ended = outputs
        device, n, max_new = logits.device, logits.shape[0], params.max_new_tokens
        workspace = SamplingWorkspace()
        alive = torch.arange(n, device=device)  # [b] chunk row held by each batch slot
        done = torch.zeros(n, dtype=torch.bool, device=device)  # [b] finished, still in the batch
        eos = torch.tensor(params.eos_token_ids, dtype=torch.long, device=device)
        pad = torch.tensor(params.pad_token_id, dtype=torch.long, device=device)
        for t in range(max_new):
            if seen is not None:
                logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
            if t < params.min_new_tokens and eos.numel():
                logits.index_fill_(1, eos, float("-inf"))  # EOS is not allowed yet
            tokens, logprobs = sample_next(logits, params, generator, workspace=workspace)  # [b], [b]
            del logits  # sampled: not alive beside the next step's
            tokens = torch.where(done, pad, tokens)
            out_tokens[t].index_copy_(0, alive, tokens)
            out_logprobs[t].index_copy_(0, alive, logprobs.masked_fill(done, 0.0))
            if seen is not None:
                seen.scatter_(1, tokens[:, None], True)
            last = t == max_new - 1
            n_done = 0
            if eos.numel() and t >= params.min_new_tokens:  # before min_new_tokens EOS was never drawn: no wait
                hit = torch.isin(tokens, eos) & ~done  # [b] rows that end at this token
                # Recorded for every slot on the device (the others keep their values): no host round trip.
                lengths.index_copy_(0, alive, torch.where(hit, t + 1, lengths.index_select(0, alive)))
                ended.index_copy_(0, alive, ended.index_select(0, alive) | hit)
                done = done | hit
                if not last:
                    n_done = host_int(done.sum())  # the step's one wait for the device
            finished = last or n_done == done.numel()
            if self.agree_over is not None and not last:  # go on (feeding padding) while a rank decodes
                finished = self.agree_over.max_over_ranks(int(not finished)) == 0
            if finished:
                break
            b = done.numel()
            step_rows = stepper.step_rows  # a padded step's real size
            if 0 < n_done < b and n_done >= self.drop_finished_fraction * b and step_rows(b - n_done) < step_rows(b):
                # the unfinished slots in order, without asking the device how many (we know: b - n_done)
                keep = torch.argsort(done.to(torch.uint8), stable=True)[: b - n_done]  # [b']
                with mapped():  # the re-selected KV buffers live to the end of the call
                    stepper.select(keep)
                alive, tokens, done = alive[keep], tokens[keep], done[keep]
                seen = seen[keep] if seen is not None else None
            logits = self.parts.logits(stepper.step(tokens))  # [b, V]

    def _graphs(self, device: torch.device) -> GraphCache | None:
        """The graph cache decode steps use: the one set on the engine, else, with ``SLIMGRPO_CUDA_GRAPHS=1`` on
        CUDA, one made now and kept for later calls."""
        if self.graph_cache is None and cuda_graph.enabled(device):
            self.graph_cache = cuda_graph.cuda_graph_cache(device)
        return self.graph_cache

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """Run the left-padded prompts ``ids`` [p, P] into ``cache``, ``prefill_chunk`` positions at a time;
        the last position's hidden state [p, H]. A chunk's queries attend to the cached keys of the chunks
        before it and causally within it, so every position sees what it sees in one piece (the same values
        up to float rounding: tests/rollout/test_prefill_chunks.py)."""
        positions = (mask.long().cumsum(-1) - 1).clamp_(min=0)  # [p, P]
        P = ids.shape[1]
        step = P if self.prefill_chunk is None else self.prefill_chunk
        attention = mask.long()
        for start in range(0, P, step):
            end = min(start + step, P)
            out = self.parts.decoder(
                input_ids=ids[:, start:end], attention_mask=attention[:, :end], position_ids=positions[:, start:end],
                past_key_values=cache, use_cache=True,
            )
            hidden = out.last_hidden_state[:, -1]
            del out
        return hidden


def host_int(t: torch.Tensor) -> int:
    """A one-element device tensor as a Python int: the decode loop's only host synchronisation per step
    (one function, so a test can count them)."""
    return int(t.item())


def _check_prompts(prompt_ids: list[list[int]]) -> None:
    if not isinstance(prompt_ids, (list, tuple)) or not prompt_ids:
        raise ValueError("prompt_ids must be a non-empty list of token-id lists")
    for i, p in enumerate(prompt_ids):
        if not isinstance(p, (list, tuple)) or len(p) == 0:
            raise ValueError(f"prompt_ids[{i}] must be a non-empty list of token ids, got {p!r}")


def left_pad(seqs: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists: ``(ids [B, P] long, mask [B, P] bool)``."""
    P = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), P), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), P, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, P - len(s):] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, P - len(s):] = True
    return ids.to(device), mask.to(device)
