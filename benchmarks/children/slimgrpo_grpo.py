"""One slimgrpo run, a process of its own (started by speed/vs_trl.py and the planner lab).

    python -m benchmarks.children.slimgrpo_grpo SPEC.json

Same SPEC and the same ``@@bench {json}`` records as trl_grpo.py. Step time is the wall time between
consecutive step callbacks (the first step uses the trainer's own ``time/step_s``); generation
throughput and memory come from the trainer's metrics (also written to ``metrics.jsonl``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

T_START = time.perf_counter()

import slimgrpo  # noqa: E402,F401  (before torch, as the slimgrpo command: sets the OpenMP wait policy)
import torch  # noqa: E402

from benchmarks.harness.records import emit, emit_end, peak_cuda_mib  # noqa: E402


def config_dict(spec: dict) -> dict:
    L = spec["completion_length"]
    return {
        "model": {"path": spec["model_path"], "dtype": spec["dtype"]},
        # target_modules is left at its default, "all-linear" (as the TRL child uses)
        "lora": {"enabled": bool(spec.get("lora")), "r": spec["lora_r"], "alpha": float(spec["lora_alpha"]),
                 "dropout": 0.0},
        "data": {"path": spec["prompts_path"], "prompt_column": "prompt", "shuffle": False,
                 # TRL tokenizes plain-text prompts as they are and renders message lists with the template
                "use_chat_template": "auto" if spec.get("conversational") else "never",
                 "max_prompt_length": spec["max_prompt_length"]},
        "rollout": {"num_generations": spec["num_generations"], "max_completion_length": L,
                    "min_completion_length": L if spec["pin_length"] else 0,  # pin the work like TRL's min_new_tokens
                    "temperature": spec["temperature"], "top_p": spec["top_p"], "top_k": spec["top_k"]},
        "rewards": {"functions": [spec["reward"]]},
        "loss": {"beta": spec["beta"], "loss_type": spec["loss_type"], "epsilon": spec["epsilon"],
                 "scale_rewards": "group", "num_iterations": 1},
        "memory": {"gradient_checkpointing": spec["gradient_checkpointing"]},
        "optim": {"learning_rate": spec["learning_rate"], "lr_scheduler_type": "constant", "warmup_steps": 0,
                  "weight_decay": 0.0, "adam_beta1": 0.9, "adam_beta2": 0.99, "adam_epsilon": 1e-8,
                  "max_grad_norm": 1.0},
        "run": {"output_dir": spec["output_dir"], "max_steps": spec["steps"],
                "batch_size": spec["prompts_per_step"] * spec["num_generations"], "seed": spec["seed"],
                "device": spec["device"], "num_threads": spec.get("num_threads"), "save_model": False,
                "resume": "never", "save_steps": 0},
        "log": {"progress": False, "log_completions_steps": 0, "logging_steps": 1},
    }


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from benchmarks.surface import Checkpointer, from_dict, run_training, validate_config

    cfg = from_dict(config_dict(spec), base_dir=str(Path.cwd()))
    validate_config(cfg)

    # TRL runs with save_strategy="no" and writes nothing; slimgrpo always writes a final checkpoint
    # (weights + optimizer state). Skip it here so both runs do the same work and the GPU workloads
    # do not write tens of GB to disk.
    Checkpointer.save = lambda self, step: None

    state = {"last": None, "setup_emitted": False}

    def on_step(trainer, step: int, metrics: dict) -> None:
        now = time.perf_counter()
        if not state["setup_emitted"]:
            state["setup_emitted"] = True
            emit({"event": "setup", "trainer": "slimgrpo", "setup_s": now - T_START - metrics["time/step_s"],
                  "threads": torch.get_num_threads(), "device": str(trainer.policy.device),
                  "dtype": str(next(trainer.policy.model.parameters()).dtype), "ref_model": False})
        step_s = metrics["time/step_s"] if state["last"] is None else now - state["last"]
        state["last"] = now
        rec = {"event": "step", "step": step, "step_s": step_s, "gen_s": metrics.get("time/generate_s"),
               "gen_tokens": metrics.get("completions/mean_length", 0.0) * cfg.run.batch_size,
               "completion_mean_length": metrics.get("completions/mean_length"),
               "trainer_step_s": metrics.get("time/step_s"), "trainer_peak_mib": metrics.get("memory/peak_mib"),
               "peak_cuda_mib": peak_cuda_mib()}
        for key in ("loss", "reward", "kl", "entropy", "grad_norm"):
            if key in metrics:
                rec[key] = metrics[key]
        emit(rec)

    t = time.perf_counter()
    run_training(cfg, callbacks=[on_step])
    emit_end(time.perf_counter() - t)
    return 0


if __name__ == "__main__":
    sys.exit(main())
