"""One decode of rollout/busy_machine.py, in a process of its own: the OpenMP wait policy must be in the
environment before torch loads, so each variant (threads x policy) gets a fresh process.

    python -m benchmarks.children.decode_threads --rows 8 --new-tokens 64 --threads 2

The W-cpu model (random init) decodes ``--rows`` completions of exactly ``--new-tokens`` tokens after a
warm-up; the last line printed is ``{"tok_s": ..., "threads": ...}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from benchmarks.harness.builders import W_CPU_SHAPE


def decode(rows: int, new_tokens: int, threads: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from benchmarks.surface import SamplingParams, TorchRolloutEngine

    torch.set_num_threads(threads)
    s = W_CPU_SHAPE
    config = Qwen2Config(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], tie_word_embeddings=True, max_position_embeddings=4096)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    engine = TorchRolloutEngine(model)
    params = SamplingParams(max_new_tokens=new_tokens, min_new_tokens=new_tokens, eos_token_ids=(0,), pad_token_id=1)
    prompt = [list(range(100, 180))]
    engine.generate(prompt, rows, SamplingParams(max_new_tokens=4, eos_token_ids=(0,), pad_token_id=1))  # warm-up
    t = time.perf_counter()
    engine.generate(prompt, rows, params)
    print(json.dumps({"tok_s": rows * new_tokens / (time.perf_counter() - t), "threads": torch.get_num_threads()}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, required=True)
    p.add_argument("--new-tokens", type=int, required=True)
    p.add_argument("--threads", type=int, required=True)
    a = p.parse_args(argv)
    decode(a.rows, a.new_tokens, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
