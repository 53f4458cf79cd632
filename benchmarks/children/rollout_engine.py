"""One measured run of rollout/vs_vllm.py (a process of its own, so its peak RSS is its own).

    python -m benchmarks.children.rollout_engine SPEC.json

It runs under the interpreter of an environment with vLLM (``vs_vllm.py --python``), which has the benchmarks
package and slimgrpo on its ``PYTHONPATH`` only (harness/processes.py).

``decode``: load the model, build the engine (``slimgrpo`` or ``vllm``), one warm-up call, then ``calls`` timed
calls of ``prompts x generations`` completions; records start-up (process start to engine ready) and
tokens/s per call. ``step``: whole GRPO steps through the Trainer with ``rollout.engine`` set; records each
step's time, generation time and weight-sync time from its metrics. Records go out as ``@@bench {json}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

T_START = time.perf_counter()

import slimgrpo  # noqa: E402,F401  (before torch: the OpenMP wait policy)
import torch  # noqa: E402

from benchmarks.harness.records import emit, read_jsonl  # noqa: E402


def _prompts(spec: dict, tok) -> list[list[int]]:
    rows = read_jsonl(Path(spec["prompts_path"]))
    return [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
            for r in rows[: spec["prompts"]]]


def decode(spec: dict) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.surface import SamplingParams

    torch.set_num_threads(spec["num_threads"])
    dtype = getattr(torch, spec["dtype"])
    tok = AutoTokenizer.from_pretrained(spec["model_path"])
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=dtype)
    prompts = _prompts(spec, tok)
    n_tokens = spec["completion_length"]
    if spec["engine"] == "vllm":
        from benchmarks.surface import VllmRolloutEngine, VllmSettings, kv_cache_bytes

        rows = spec["prompts"] * spec["generations"]
        longest = max(map(len, prompts)) + n_tokens
        settings = VllmSettings(model_path=spec["model_path"], dtype=spec["dtype"], device="cpu",
                                max_model_len=longest, max_num_seqs=rows,
                                kv_cache_bytes=kv_cache_bytes(model.config, rows * longest, dtype.itemsize))
        engine = VllmRolloutEngine(model, settings)
    else:
        from benchmarks.surface import TorchRolloutEngine

        engine = TorchRolloutEngine(model)
    emit({"kind": "start", "start_s": time.perf_counter() - T_START})
    params = SamplingParams(max_new_tokens=n_tokens, min_new_tokens=n_tokens if spec["pin"] else 0,
                            temperature=1.0, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id or 0)
    g = torch.Generator().manual_seed(0)
    for call in range(spec["calls"] + 1):
        t = time.perf_counter()
        r = engine.generate(prompts, spec["generations"], params, g)
        s = time.perf_counter() - t
        tokens = int(r.completion_lengths.sum())
        if call:  # the first is the warm-up
            emit({"kind": "decode", "tokens": tokens, "seconds": s, "tokens_per_s": tokens / s})
    if hasattr(engine, "close"):
        engine.close()


def step(spec: dict) -> None:
    from benchmarks.surface import Trainer, from_dict, validate_config

    L = spec["completion_length"]
    cfg = from_dict({
        "model": {"path": spec["model_path"], "dtype": spec["dtype"]},
        "lora": {"enabled": spec["lora"], "r": 16, "alpha": 32.0, "dropout": 0.0},
        "data": {"path": spec["prompts_path"], "prompt_column": "prompt", "shuffle": False, "max_prompt_length": 256},
        "rollout": {"num_generations": spec["generations"], "max_completion_length": L,
                    "min_completion_length": L if spec["pin"] else 0, "engine": spec["engine"]},
        "rewards": {"functions": ["gsm8k_accuracy"]},
        "loss": {"beta": 0.04, "loss_type": "dapo"},
        "optim": {"learning_rate": 1e-6, "lr_scheduler_type": "constant", "warmup_steps": 0},
        "run": {"output_dir": spec["output_dir"], "max_steps": spec["steps"], "resume": "never", "save_steps": 0,
                "save_model": False, "batch_size": spec["prompts"] * spec["generations"], "device": "cpu",
                "num_threads": spec["num_threads"], "seed": 0},
        "log": {"progress": False, "log_completions_steps": 0},
    }, base_dir=str(Path.cwd()))
    validate_config(cfg)
    trainer = Trainer(cfg)  # built whole
    emit({"kind": "start", "start_s": time.perf_counter() - T_START})
    trainer.train()
    for m in read_jsonl(Path(spec["output_dir"]) / "metrics.jsonl"):
        if "time/step_s" in m:
            emit({"kind": "step", "step": m.get("step"), "step_s": m["time/step_s"], "gen_s": m["time/generate_s"],
                  "tokens_per_s": m["gen/tokens_per_s"], "sync_s": m.get("rollout/weight_sync_s", 0.0),
                  "logprob_diff_max": m.get("rollout/logprob_diff_max")})


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    {"decode": decode, "step": step}[spec["mode"]](spec)
