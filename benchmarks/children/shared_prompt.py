"""One measurement of update/shared_prompt.py in a process of its own, so that its peak RSS (read by the parent
with ``os.wait4``) is this measurement's alone.

    python -m benchmarks.children.shared_prompt --mode {inputs,shared,unshared} [shared_prompt.py's flags]

``inputs`` only builds the model and the batch (the baseline the parent subtracts); ``shared`` and ``unshared``
run one optimizer step's forward + backward with each group's prompt run once or once per completion. The last
line printed is ``{"seconds": ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.update.shared_prompt import parse_args


def measure(a: argparse.Namespace) -> None:
    import slimgrpo  # noqa: F401  (before torch: the OpenMP wait policy, as in training)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks.surface import (LossSettings, Normaliser, PromptSharing, UpdateBatch, UpdateSettings,
                                    accumulate_gradients)

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                         num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                         max_position_embeddings=a.prompt_len + a.completion_len + 8, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.config._attn_implementation = "sdpa"
    g = torch.Generator().manual_seed(1)
    G, P, T = a.completions, a.prompt_len, a.completion_len
    prompt = torch.randint(0, a.vocab, (P,), generator=g)
    comp = torch.randint(0, a.vocab, (G, T), generator=g)
    ids = torch.cat([prompt.expand(G, P), comp], dim=1)
    am = torch.ones_like(ids)
    batch = UpdateBatch(ids, am, comp, am[:, P:].bool(), torch.randn(G, generator=g))
    seconds = 0.0
    if a.mode != "inputs":
        norm = Normaliser.of(batch.loss_mask)
        t = time.perf_counter()
        sharing = PromptSharing.of(model) if a.mode == "shared" else None  # the planner's verdict, read once
        accumulate_gradients(model, batch, UpdateSettings(LossSettings(), fuse=True, share_prompt=sharing), norm)
        seconds = time.perf_counter() - t
    print(json.dumps({"seconds": seconds}))


def main(argv: list[str] | None = None) -> int:
    measure(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
