"""One TRL GRPOTrainer run, a process of its own (started by speed/vs_trl.py and the learning benchmarks).

    python -m benchmarks.children.trl_grpo SPEC.json

SPEC holds the settings shared with the slimgrpo run (speed/vs_trl.py's ``Settings.spec``), or a recipe's
GRPOConfig keys (``grpo_config``, learning/trl_config.py). Progress goes to stdout as ``@@bench {json}`` lines:
one ``setup`` record, one ``step`` record per optimizer step, one ``end`` record. Step time is the wall time
between consecutive ``on_step_end`` callbacks (the first step counts from ``on_train_begin``), measured the same
way as in slimgrpo_grpo.py. No slimgrpo is loaded here: the process's peak RSS is TRL's alone.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

T_START = time.perf_counter()

import torch  # noqa: E402

from benchmarks.harness.records import emit, emit_end, peak_cuda_mib  # noqa: E402


# TRL times `generate` in a ProfilingContext but only reports the duration to wandb/mlflow/trackio.
# Keep the durations here so the generation throughput can be read with report_to="none".
GEN_TIMES: list[float] = []


def patch_profiling() -> None:
    from trl.extras import profiling

    original = profiling.ProfilingContext._log_metrics

    def _log_metrics(self, duration: float) -> None:
        if self.name.endswith("transformers.generate"):
            GEN_TIMES.append(duration)
        original(self, duration)

    profiling.ProfilingContext._log_metrics = _log_metrics


def build_config(spec: dict):
    from trl import GRPOConfig

    if "grpo_config" in spec:  # learn_suite: the recipe's keys only, GRPOConfig's defaults for the rest
        return GRPOConfig(**harness_settings(spec), **spec["grpo_config"])
    L = spec["completion_length"]
    rows = spec["prompts_per_step"] * spec["num_generations"]
    on_cpu = spec["device"] == "cpu"
    return GRPOConfig(
        output_dir=spec["output_dir"],
        # one optimizer step = one generation batch = prompts_per_step prompts x num_generations
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=1,
        num_generations=spec["num_generations"],
        max_completion_length=L,
        # pin the work: EOS is suppressed until L tokens
        generation_kwargs={"min_new_tokens": L} if spec["pin_length"] else None,
        temperature=spec["temperature"],
        top_p=spec["top_p"],
        top_k=spec["top_k"],
        beta=spec["beta"],
        epsilon=spec["epsilon"],
        loss_type=spec["loss_type"],
        scale_rewards="group",
        num_iterations=1,
        learning_rate=spec["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        reward_weights=spec.get("reward_weights"),
        optim="adamw_torch_fused",  # torch.optim.AdamW(fused=True): TRL 1.16's default, and what slimgrpo uses
        max_steps=spec["steps"],
        seed=spec["seed"],
        data_seed=spec["seed"],
        shuffle_dataset=bool(spec.get("shuffle", False)),  # default: both take the prompts in file order
        gradient_checkpointing=spec["gradient_checkpointing"],
        bf16=spec["dtype"] == "bfloat16" and not on_cpu,
        fp16=False,
        use_cpu=on_cpu,
        use_vllm=False,
        model_init_kwargs={"dtype": spec["dtype"]},
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
    )


def harness_settings(spec: dict) -> dict:
    """What the harness itself needs, none of it a training setting: where to write, CPU or not, no checkpoints
    (the model is saved once at the end), a log record every step, no progress bar."""
    return {"output_dir": spec["output_dir"], "use_cpu": spec["device"] == "cpu", "save_strategy": "no",
            "report_to": "none", "logging_steps": 1, "log_completions": False, "disable_tqdm": True}


def load_reward(spec: str):
    """``path/to/file.py:fn`` or ``package.module:fn`` (the same specs slimgrpo accepts)."""
    import importlib
    import importlib.util

    target, name = spec.rsplit(":", 1)
    if target.endswith(".py"):
        mod_spec = importlib.util.spec_from_file_location("_bench_rewards", target)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, name)


class StepTimer:
    """A TrainerCallback that emits one record per optimizer step."""

    def __init__(self, rows: int):
        from transformers import TrainerCallback

        self.rows = rows
        self.last = None
        self.pending: dict | None = None
        timer = self

        class _CB(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                timer.last = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                now = time.perf_counter()
                timer.pending = {"event": "step", "step": state.global_step, "step_s": now - timer.last,
                                 "gen_s": GEN_TIMES[-1] if GEN_TIMES else None,
                                 "peak_cuda_mib": peak_cuda_mib()}
                timer.last = now

            def on_log(self, args, state, control, logs=None, **kw):
                logs = logs or {}
                if timer.pending is None or "completions/mean_length" not in logs:
                    return
                rec = timer.pending
                mean_len = logs["completions/mean_length"]
                rec["gen_tokens"] = mean_len * timer.rows
                rec["completion_mean_length"] = mean_len
                rec["trainer_step_s"] = logs.get("step_time")  # TRL's own: training_step, no optimizer step
                for key in ("loss", "reward", "kl", "entropy", "grad_norm"):
                    if key in logs:
                        rec[key] = logs[key]
                for key, value in logs.items():  # per reward function: rewards/<name>/mean
                    if key.startswith("rewards/") and key.endswith("/mean"):
                        rec[key] = value
                emit(rec)
                timer.pending = None

        self.callback = _CB()


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    if spec.get("num_threads"):
        torch.set_num_threads(spec["num_threads"])
    from datasets import load_dataset
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOTrainer

    reward_fns = [load_reward(r) for r in spec.get("rewards") or [spec["reward"]]]
    patch_profiling()
    # Load the tokenizer explicitly: AutoTokenizer on a folder whose config says qwen2 builds a
    # Qwen2Tokenizer with a different pre-tokenizer, so the prompts would differ from slimgrpo's.
    tok = PreTrainedTokenizerFast.from_pretrained(spec["model_path"])
    tok.padding_side = "left"
    dataset = load_dataset("json", data_files=spec["prompts_path"], split="train")
    args = build_config(spec)
    rows = args.per_device_train_batch_size * args.gradient_accumulation_steps  # completions per optimizer step
    timer = StepTimer(rows)
    peft_config = None
    if spec.get("lora"):
        from peft import LoraConfig

        peft_config = LoraConfig(r=spec["lora_r"], lora_alpha=spec["lora_alpha"], lora_dropout=0.0,
                                 target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=spec["model_path"], reward_funcs=reward_fns, args=args, train_dataset=dataset,
                          processing_class=tok, callbacks=[timer.callback], peft_config=peft_config)
    emit({"event": "setup", "trainer": "trl", "setup_s": time.perf_counter() - T_START,
          "threads": torch.get_num_threads(), "device": str(trainer.model.device),
          "dtype": str(trainer.model.dtype), "ref_model": trainer.ref_model is not None})
    t = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t
    if spec.get("save_dir"):  # the learning benchmark evaluates the trained weights afterwards
        trainer.save_model(spec["save_dir"])
        tok.save_pretrained(spec["save_dir"])
    emit_end(train_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
