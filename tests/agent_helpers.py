"""Shared pieces of the agent tests: a Hermes-style tool chat template and a scripted sampler."""

from __future__ import annotations

import torch

# Hermes-style (Qwen2.5-like) template: tools listed in a system block, calls as <tool_call>{json}</tool_call>,
# every turn closed by the EOS token, tool results in their own turn.
TOOL_TEMPLATE = (
    "{%- if tools %}<system>Tools:{% for t in tools %} {{ t | tojson }}{% endfor %}<eos>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}<assistant>{{ m.content }}"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<eos>\n"
    "{%- elif m.role == 'tool' %}<tool>{{ m.content }}<eos>\n"
    "{%- else %}<{{ m.role }}>{{ m.content }}<eos>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<assistant>{% endif %}"
)


class ScriptedSampler:
    """Stands in for ``sample_next``: every row writes its scripted turns (token lists ending in EOS),
    mirroring the engine's lock-step turns, and the returned log-prob is the real one under the model's
    tempered logits -- so the sampler's log-probs can be checked against a full recomputation."""

    def __init__(self, scripts: list[list[list[int]]], pad: int, temperature: float = 1.0) -> None:
        self.scripts = scripts
        self.alive = list(range(len(scripts)))
        self.turn = [0] * len(scripts)
        self.pos = [0] * len(scripts)
        self.pad, self.temperature = pad, temperature

    def __call__(self, logits, params, generator=None, *, workspace=None):
        assert logits.shape[0] == len(self.alive), (logits.shape, self.alive)
        out = []
        for r in self.alive:
            turn = self.scripts[r][self.turn[r]]
            if self.pos[r] < len(turn):
                out.append(turn[self.pos[r]])
                self.pos[r] += 1
            else:
                out.append(self.pad)
        tokens = torch.tensor(out, dtype=torch.long, device=logits.device)
        logp = torch.log_softmax(logits.float() / self.temperature, dim=-1).gather(1, tokens[:, None])[:, 0]
        if all(self.pos[r] >= len(self.scripts[r][self.turn[r]]) for r in self.alive):
            nxt = []
            for r in self.alive:
                if self.turn[r] + 1 < len(self.scripts[r]):
                    self.turn[r] += 1
                    self.pos[r] = 0
                    nxt.append(r)
            self.alive = nxt
        return tokens, logp
