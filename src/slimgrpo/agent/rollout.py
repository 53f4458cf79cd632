"""Multi-turn rollouts with tool calls, continued on the KV cache of the live weights.

One call of :meth:`AgentRollout.generate`:

1. every rollout row gets its environment (``Toolbox.assign``: ``reset()`` may add to the prompt) and its
   prompt is rendered by the chat template with the row's tools (``tools=``);
2. each distinct prompt is prefilled once and its KV cache fanned out to its rows (the G completions of a
   group share the prefix, as in ``TorchRolloutEngine``);
3. rows decode one assistant turn each, in lock-step; a row whose turn ended (EOS or the length limit)
   waits, fed a masked padding token, until every row's turn ended;
4. the tool calls of each finished turn are parsed and run (``ToolRunner.run_rows``: different rows' calls
   run concurrently, ``rollout.max_concurrent_tool_calls`` rows at most), the results rendered as tool
   messages by the chat template, and **only those new tokens** (plus the turn's last sampled token, not
   yet in the cache) are prefilled onto the kept cache of the rows that go on; the others leave the batch;
5. repeat until no row calls a tool, ``max_tool_calling_iterations`` or the length limit.

The completion of a row is every token after its prompt: the model's turns and the tool messages between
them. ``Rollout.tool_mask`` is False on tool tokens: they stay in the context of the update (which sees
exactly this token sequence) but are left out of the loss, the KL and the length metrics. The budget
``max_new_tokens`` counts both, like TRL's ``max_completion_length``; a tool message that would not fit
ends the row instead (TRL drops it too).

Decoding goes through the model's own forward with a Hugging Face cache and a 2-D attention mask that has
holes where waiting rows were fed padding (positions skip them), so the lean Llama stepper is not used here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from slimgrpo.rollout.engine import left_pad
from slimgrpo.agent.environments import Toolbox
from slimgrpo.rollout.model_parts import eval_mode
from slimgrpo.rollout.sampling import SamplingParams, SamplingWorkspace, sample_next
from slimgrpo.agent.tool_calls import ToolRunner, parse_tool_calls, split_tools
from slimgrpo.containers import PromptBatch, Rollout
from slimgrpo.forward.gather import select_cache_rows

_CALL_MARKUP = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.DOTALL)


class KVSession:
    """A batch of rows whose KV cache keeps growing: decode steps and multi-token prefills alike.

    ``feed(ids [b, k], valid [b, k])`` appends k columns to every row's cache; ``valid`` False columns
    are padding (masked out of attention, no position used). Returns the hidden state of the last column.
    """

    def __init__(self, parts, cache: DynamicCache, mask: torch.Tensor) -> None:
        self.parts, self.cache = parts, cache
        self.attn = mask.long()  # [b, L] 1 on real tokens
        self.next_pos = mask.long().sum(-1)  # [b] position id of each row's next real token

    def feed(self, ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        v = valid.long()
        positions = (self.next_pos[:, None] + v.cumsum(-1) - 1).clamp_(min=0)  # [b, k]
        self.attn = torch.cat([self.attn, v], dim=1)
        hidden = self.parts.decoder(
            input_ids=ids, attention_mask=self.attn, position_ids=positions,
            past_key_values=self.cache, use_cache=True,
        ).last_hidden_state[:, -1]  # [b, H]
        self.next_pos = self.next_pos + v.sum(-1)
        return hidden

    def select(self, keep: torch.Tensor) -> None:
        select_cache_rows(self.cache, keep)
        self.attn, self.next_pos = self.attn[keep], self.next_pos[keep]


@dataclass
class RowState:
    """What one rollout row has produced so far."""

    tokens: list[int] = field(default_factory=list)
    model: list[bool] = field(default_factory=list)  # True where the model wrote the token
    logprobs: list[float] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn: list[int] = field(default_factory=list)  # tokens of the current turn
    calls: int = 0
    failed: int = 0
    iterations: int = 0
    truncated: bool = False
    faults: dict[str, int] = field(default_factory=dict)  # tool fault kind -> count
    dropped: bool = False  # the last tool results did not fit in the length limit


@dataclass(frozen=True)
class AgentSettings:
    """How an agent's conversations are rendered and bounded.

    ``max_iterations``: most tool-calling rounds per rollout (None = until the length limit);
    ``tool_call_format``: ``auto`` / ``hermes`` / ``llama3`` (``tool_calls.parse_tool_calls``);
    ``chat_template``: a template overriding the tokenizer's (``data.chat_template``); ``system_prompt``:
    prepended as a system message when the prompt has none (``data.system_prompt``);
    ``max_prompt_length``: the longest prompt rendered with its tools (``data.max_prompt_length``);
    ``chat_template_kwargs``: the template's extra variables (``data.chat_template_kwargs``)."""

    max_iterations: int | None = None
    tool_call_format: str = "auto"
    chat_template: str | None = None
    system_prompt: str | None = None
    max_prompt_length: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None


@dataclass
class _Decoding:
    """What every turn of one ``_run`` decodes with: the rows' KV cache, the sampling settings, the sampler's
    generator and workspace, and the EOS / padding ids as tensors."""

    session: KVSession
    params: SamplingParams
    generator: torch.Generator | None
    workspace: SamplingWorkspace
    eos: torch.Tensor
    pad: torch.Tensor


class AgentRollout:
    """Tool-calling rollouts over a ``TorchRolloutEngine``'s live model.

    Args:
        engine: supplies the model parts (``engine.parts``) and packed weights.
        tokenizer: renders prompts and tool messages with its chat template.
        toolbox: tools and environments (``environments.Toolbox``).
        runner: runs the calls (time limit, output cap, sandbox).
        settings: rendering and bounds of the conversations (``AgentSettings``; None: its defaults).
    """

    def __init__(self, engine, tokenizer, toolbox: Toolbox, runner: ToolRunner | None = None,
                 settings: AgentSettings | None = None) -> None:
        self.engine, self.parts, self.tok = engine, engine.parts, tokenizer
        self.toolbox = toolbox
        self.runner = runner or ToolRunner()
        self.settings = settings or AgentSettings()
        parse_tool_calls("", self.settings.tool_call_format)  # validates the format name

    # ------------------------------------------------------------------ rendering
    def _render(self, messages: list[dict[str, Any]], tools, add_generation_prompt: bool) -> list[int]:
        text = self.tok.apply_chat_template(messages, tools=tools or None, chat_template=self.settings.chat_template,
                                            tokenize=False, add_generation_prompt=add_generation_prompt,
                                            **(self.settings.chat_template_kwargs or {}))
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def prompt_messages(self, prompt, observation) -> list[dict[str, Any]]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
        if self.settings.system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.settings.system_prompt}] + messages
        if isinstance(observation, str) and observation:
            messages[-1] = {**messages[-1], "content": messages[-1]["content"] + observation}
        return messages

    def tool_suffix_ids(self, tool_messages: list[dict[str, Any]], eos_ids: tuple[int, ...]) -> list[int]:
        """Tokens the chat template puts after an assistant turn's EOS for these tool messages, up to
        the next assistant header (TRL's ``_get_tool_suffix_ids``: rendered with and without them)."""
        call = [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]
        dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": call}]
        prefix = self._render(dummy, None, add_generation_prompt=False)
        full = self._render(dummy + tool_messages, None, add_generation_prompt=True)
        ends = [i for i, t in enumerate(prefix) if t in eos_ids]
        if ends:
            prefix = prefix[: ends[-1] + 1]
        if full[: len(prefix)] != prefix:
            raise ValueError("the chat template does not render tool messages as a suffix of the conversation "
                             "(the tokens before them change); use a prefix-preserving template "
                             "(data.chat_template)")
        return full[len(prefix):]

    # ------------------------------------------------------------------ generation
    def generate(self, batch: PromptBatch, num_generations: int, params: SamplingParams,
                 generator: torch.Generator | None = None) -> Rollout:
        G = num_generations
        rows_in = [{"prompt": p, **{k: v[i] for k, v in batch.columns.items()}}
                   for i, p in enumerate(batch.prompts) for _ in range(G)]
        observations = self.toolbox.assign(rows_in)
        tools = [self.toolbox.row_tools(r) for r in range(len(rows_in))]
        tables = [split_tools(t) for t in tools]
        prompt_ids = [self._render(self.prompt_messages(row["prompt"], obs), t, add_generation_prompt=True)
                      for row, obs, t in zip(rows_in, observations, tools)]
        longest = max(len(p) for p in prompt_ids)
        allowed = self.settings.max_prompt_length
        if allowed is not None and longest > allowed:
            raise ValueError(f"a prompt rendered with its tools has {longest} tokens > data.max_prompt_length="
                             f"{allowed}: raise data.max_prompt_length (the tool schemas count)")
        device = self.parts.device
        n = len(rows_in)
        limit = self.engine.max_batch_rows  # a TorchRolloutEngine (wrapped under torchrun: read through)
        chunk = n if limit is None else min(n, limit)
        states: list[RowState] = []
        with torch.no_grad(), eval_mode(self.parts.root), self.parts.packed_weights(chunk, "auto"):
            for start in range(0, n, chunk):  # rollout.max_batch_rows bounds the rows decoded at once
                rows = slice(start, min(start + chunk, n))
                states += self._run(prompt_ids[rows], tables[rows], params, generator, device)
        return self._to_rollout(prompt_ids, states, G, params, device)

    def _run(self, prompt_ids, tables, params: SamplingParams, generator, device) -> list[RowState]:
        n = len(prompt_ids)
        distinct: dict[tuple[int, ...], int] = {}
        slot = [distinct.setdefault(tuple(p), len(distinct)) for p in prompt_ids]
        ids, mask = left_pad([list(p) for p in distinct], params.pad_token_id, device)
        cache = DynamicCache(config=self.parts.config)
        positions = (mask.long().cumsum(-1) - 1).clamp_(min=0)
        hidden = self.parts.decoder(input_ids=ids, attention_mask=mask.long(), position_ids=positions,
                                    past_key_values=cache, use_cache=True).last_hidden_state[:, -1]
        row_slot = torch.tensor(slot, device=device)
        logits = self.parts.logits(hidden)[row_slot]  # [n, V]
        select_cache_rows(cache, row_slot)  # one prefill per distinct prompt, fanned out to its rows
        session = KVSession(self.parts, cache, mask[row_slot])
        del cache

        states = [RowState() for _ in range(n)]
        alive = list(range(n))  # row held by each batch slot
        dec = _Decoding(session, params, generator, SamplingWorkspace(),
                        eos=torch.tensor(params.eos_token_ids, dtype=torch.long, device=device),
                        pad=torch.tensor(params.pad_token_id, dtype=torch.long, device=device))
        while alive:
            pending = self._decode_turn(dec, logits, alive, states)
            calls = [self._end_turn(states[r], params) for r in alive]
            asking = [b for b, c in enumerate(calls) if c]
            # the tool calls of different rows run concurrently (rollout.max_concurrent_tool_calls); the
            # results come back in row order, whichever call finishes first
            results = self.runner.run_rows([(calls[b], tables[alive[b]]) for b in asking])
            going, feeds = [], []
            for b, res in zip(asking, results):
                suffix = self._take_results(states[alive[b]], res, params)
                if suffix is not None:
                    going.append(b)
                    feeds.append([pending[b]] + suffix)
            if not going:
                break
            keep = torch.tensor(going, device=device)
            session.select(keep)
            alive = [alive[b] for b in going]
            block, valid = left_pad(feeds, params.pad_token_id, device)
            logits = self.parts.logits(session.feed(block, valid))
        return states

    def _decode_turn(self, dec: _Decoding, logits, alive: list[int], states: list[RowState]) -> list[int]:
        """Sample one assistant turn for every batch slot; returns each slot's last token (not yet in
        the cache). Rows whose turn ended are fed masked padding until all have ended."""
        session, params, eos, pad = dec.session, dec.params, dec.eos, dec.pad
        b = len(alive)
        device = logits.device
        waiting = torch.zeros(b, dtype=torch.bool, device=device)
        last = [params.pad_token_id] * b
        budget = [params.max_new_tokens - len(states[r].tokens) for r in alive]
        for s in alive:
            states[s].turn = []
        while True:
            if params.min_new_tokens and eos.numel():
                early = torch.tensor([sum(states[r].model) < params.min_new_tokens for r in alive], device=device)
                if bool(early.any()):
                    logits[early.nonzero().squeeze(1)[:, None], eos[None, :]] = float("-inf")
            tokens, logprobs = sample_next(logits, params, dec.generator, workspace=dec.workspace)
            tokens = torch.where(waiting, pad, tokens)
            hit = torch.isin(tokens, eos) & ~waiting
            tok_list, lp_list = tokens.tolist(), logprobs.tolist()
            ended = hit.clone()
            for i, r in enumerate(alive):
                if waiting[i]:
                    continue
                st = states[r]
                st.tokens.append(tok_list[i])
                st.model.append(True)
                st.logprobs.append(lp_list[i])
                st.turn.append(tok_list[i])
                last[i] = tok_list[i]
                if len(st.turn) >= budget[i] and not hit[i]:
                    ended[i] = True
                    st.truncated = True
            waiting = waiting | ended
            if bool(waiting.all()):
                return last
            logits = self.parts.logits(session.feed(tokens[:, None], (~waiting)[:, None]))

    def _end_turn(self, st: RowState, params: SamplingParams) -> list | None:
        """Record the turn as an assistant message; returns its tool calls to run, or None when the row is
        finished (no call, or ``max_iterations`` rounds done)."""
        eos = set(params.eos_token_ids)
        turn = st.turn[:-1] if st.turn and st.turn[-1] in eos else st.turn
        text = self.tok.decode(turn, skip_special_tokens=False)
        for t in eos:
            piece = self.tok.convert_ids_to_tokens(t)
            if isinstance(piece, str) and piece:
                text = text.replace(piece, "")
        calls = [] if st.truncated else parse_tool_calls(text, self.settings.tool_call_format)
        message: dict[str, Any] = {"role": "assistant", "content": _CALL_MARKUP.sub("", text) if calls
                                   else text}
        if calls:
            message["tool_calls"] = [c.as_message_call() for c in calls]
            if self.settings.tool_call_format != "hermes" and "<tool_call>" not in text:
                message["content"] = ""
        st.messages.append(message)
        rounds = self.settings.max_iterations
        if not calls or (rounds is not None and st.iterations >= rounds):
            return None
        return calls

    def _take_results(self, st: RowState, results, params: SamplingParams) -> list[int] | None:
        """Add the results of the row's calls (``ToolRunner.run_turn``, in call order); returns the
        tool-message tokens to feed, or None when they do not fit and the row ends."""
        tool_messages = [{"role": "tool", "name": res.name, "content": res.content} for res in results]
        suffix = self.tool_suffix_ids(tool_messages, params.eos_token_ids)
        st.calls += len(results)
        st.failed += sum(res.failed for res in results)
        for res in results:
            if res.fault:
                st.faults[res.fault] = st.faults.get(res.fault, 0) + 1
        if len(st.tokens) + len(suffix) > params.max_new_tokens:
            st.dropped = True  # the results do not fit: the rollout ends here
            return None
        st.messages.extend(tool_messages)
        st.tokens.extend(suffix)
        st.model.extend([False] * len(suffix))
        st.logprobs.extend([0.0] * len(suffix))
        st.iterations += 1
        return suffix

    # ------------------------------------------------------------------ output
    def _to_rollout(self, prompt_ids, states: list[RowState], G: int, params: SamplingParams,
                    device) -> Rollout:
        n = len(states)
        T = max(1, max(len(s.tokens) for s in states))
        comp = torch.full((n, T), params.pad_token_id, dtype=torch.long)
        cmask = torch.zeros(n, T, dtype=torch.bool)
        tmask = torch.zeros(n, T, dtype=torch.bool)
        logp = torch.zeros(n, T, dtype=torch.float32)
        for i, s in enumerate(states):
            k = len(s.tokens)
            comp[i, :k] = torch.tensor(s.tokens, dtype=torch.long)
            cmask[i, :k] = True
            tmask[i, :k] = torch.tensor(s.model, dtype=torch.bool)
            logp[i, :k] = torch.tensor(s.logprobs, dtype=torch.float32)
        pids, pmask = left_pad(prompt_ids, params.pad_token_id, device)
        tool_tokens = float((cmask & ~tmask).sum())
        model_tokens = float(tmask.sum())
        faults: dict[str, int] = {}
        for s in states:
            for k, v in s.faults.items():
                faults[k] = faults.get(k, 0) + v
        calls = sum(s.calls for s in states)
        metrics = {
            "tools/calls_per_completion": calls / n,
            "tools/failed_calls": float(sum(s.failed for s in states)),
            "tools/failure_frequency": sum(s.failed for s in states) / calls if calls else 0.0,
            "tools/turns_per_completion": sum(len([m for m in s.messages if m["role"] == "assistant"])
                                              for s in states) / n,
            "tools/model_tokens": model_tokens,
            "tools/tool_tokens": tool_tokens,
            "tools/dropped_results": float(sum(s.dropped for s in states)),
            **{f"tools/faults/{k}": float(v) for k, v in sorted(faults.items())},
        }
        columns = {}
        if self.toolbox.environments is not None:
            columns["environments"] = list(self.toolbox.environments)
        return Rollout(
            prompt_ids=pids, prompt_mask=pmask, completion_ids=comp.to(device), completion_mask=cmask.to(device),
            is_truncated=torch.tensor([s.truncated for s in states], device=device),
            sampler_logprobs=logp.to(device), num_generations=G, tool_mask=tmask.to(device),
            prompts_per_row=True, conversations=[s.messages for s in states], reward_columns=columns,
            metrics=metrics,
        )


def merge_tool_metrics(parts: list[tuple[dict[str, float], int]]) -> dict[str, float]:
    """The ``tools/*`` metrics of several rollouts (``(metrics, rows)`` each; one per rank) as one rollout
    of all their rows would give them: per-completion means weighted by rows, the failure frequency from
    the summed failed and made calls, everything else (token, failure and fault counts) summed."""
    rows = sum(n for _, n in parts)
    keys = sorted({k for m, _ in parts for k in m})
    merged: dict[str, float] = {}
    for k in keys:
        if k.endswith("_per_completion"):
            merged[k] = sum(m.get(k, 0.0) * n for m, n in parts) / max(rows, 1)
        elif k != "tools/failure_frequency":
            merged[k] = float(sum(m.get(k, 0.0) for m, _ in parts))
    if "tools/failure_frequency" in keys:
        calls = sum(m.get("tools/calls_per_completion", 0.0) * n for m, n in parts)
        merged["tools/failure_frequency"] = merged.get("tools/failed_calls", 0.0) / calls if calls else 0.0
    return merged


__all__ = ["AgentRollout", "KVSession", "merge_tool_metrics"]
