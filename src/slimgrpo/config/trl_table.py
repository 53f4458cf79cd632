"""The table: every key of TRL 1.16's ``trl grpo`` YAML (``GRPOConfig`` with the ``TrainingArguments`` it inherits,
``ModelConfig``, the script arguments), the own fields of TRL 1.12's ``PPOConfig`` (``slimgrpo.trl.PPOTrainer``)
and what slimgrpo does with each (``trl_rules.py``). One table for every way
a TRL setting reaches slimgrpo: the config parser's hints for a TRL name in a slimgrpo config (``hint_for``),
``slimgrpo train --trl-config`` (``trl/yaml.py``) and docs/trl-migration.md's table
(``scripts/gen_trl_migration.py``)."""

from __future__ import annotations

from slimgrpo.config import trl_rules as r
from slimgrpo.config.trl_rules import I, M, R

_VLLM_SERVER = "server mode only: slimgrpo's vLLM runs colocated in the training process (no server to reach)"
_HUB = "slimgrpo never uploads; push the run's final/ folder yourself"
_EVAL = "slimgrpo's evaluation is eval.data / eval.steps / eval.num_samples; this knob has no counterpart"
_LOADER = "prompts are read and tokenized up front; there is no DataLoader to tune"
_LOG = "slimgrpo writes every step to metrics.jsonl and the log.report_to backends"
_DDP = "slimgrpo's DDP wrapper chooses this itself"
_LOSS_NEW = "same name and meaning as TRL"


def _same_name(section: str, keys: str, note: str = "") -> list[r.Rule]:
    """GRPOConfig keys that slimgrpo takes under the same name in ``section`` (``keys``: space-separated, in
    table order), each with ``note``: one line for a run of plain renames instead of one ``M`` each."""
    return [M(key, f"{section}.{key}", note) for key in keys.split()]


RULES: list[r.Rule] = [
    # ------------------------------------------------------------- model (ModelConfig, model_init_kwargs)
    M("model_name_or_path", "model.path", "a local folder, or a hub name when online", source="ModelConfig"),
    R("model_revision", "slimgrpo loads a folder as it is; download the revision first", ok=("main", None),
      source="ModelConfig"),
    M("dtype", "model.dtype", "TRL's ModelConfig default float32; slimgrpo's auto = bfloat16 on GPUs that have "
      "it, float32 on CPU", r._dtype, source="ModelConfig"),
    M("torch_dtype", "model.dtype", "older name of dtype", r._dtype, source="legacy"),
    M("attn_implementation", "model.attn_implementation", "TRL default None (transformers picks); slimgrpo "
      "sdpa. flash_attention_2 needs the flash-attn package (checked before loading)", source="ModelConfig"),
    M("use_peft", "lora.enabled", "fp32 adapters that multiply in the model's dtype, as under TRL's bf16 "
      "autocast (peft alone casts each adapter's input to fp32: docs/memory.md)", source="ModelConfig"),
    M("lora_r", "lora.r", source="ModelConfig"),
    M("lora_alpha", "lora.alpha", source="ModelConfig"),
    M("lora_dropout", "lora.dropout", "TRL's 0.05 where use_peft and silent (a slimgrpo YAML's default: 0.0)", source="ModelConfig"),
    M("lora_target_modules", "lora.target_modules", "TRL's None = peft's per-architecture default "
      "(q_proj, v_proj for Llama / Qwen), read from the model's config.json; all-linear where it cannot be read "
      "(a slimgrpo YAML's default)", r._lora_targets, source="ModelConfig"),
    R("lora_target_parameters", "LoRA on parameters (MoE experts) is not supported", source="ModelConfig"),
    R("lora_modules_to_save", "extra fully-trained modules are not supported with LoRA", source="ModelConfig"),
    R("lora_task_type", "slimgrpo trains causal LMs only", ok=("CAUSAL_LM", None), source="ModelConfig"),
    R("use_rslora", "rank-stabilised LoRA is not supported", ok=(False, None), source="ModelConfig"),
    R("use_dora", "DoRA is not supported", ok=(False, None), source="ModelConfig"),
    R("load_in_8bit", "8-bit base weights are not supported; use load_in_4bit (QLoRA)", ok=(False, None),
      source="ModelConfig"),
    M("load_in_4bit", "model.load_in_4bit", "QLoRA, CUDA only, needs use_peft", source="ModelConfig"),
    M("bnb_4bit_quant_type", "model.load_in_4bit", "NF4 only", r._quant_type, source="ModelConfig"),
    R("use_bnb_nested_quant", "nested (double) quantisation is not configurable", ok=(False, None),
      source="ModelConfig"),
    R("bnb_4bit_quant_storage", "the storage dtype of 4-bit weights is not configurable", source="ModelConfig"),
    M("model_init_kwargs", "model.dtype", "dtype/torch_dtype, attn_implementation, trust_remote_code are read; "
      "other keys refused", r._model_init_kwargs,
      targets=("model.attn_implementation", "model.trust_remote_code")),
    M("trust_remote_code", "model.trust_remote_code", "off by default in both"),
    R("router_aux_loss_coef", "the MoE router auxiliary loss is not added"),
    M("disable_dropout", "model.disable_dropout", _LOSS_NEW),
    I("cast_lm_head_to_fp32", "always on in effect: the chunked LM head accumulates log-probs in float32",
      source="GRPOConfig"),
    # ------------------------------------------------------------- data (ScriptArguments, dataset mixture)
    M("dataset_name", "data.path", "a .jsonl/.json/.parquet/.csv file, a save_to_disk folder, or a hub name "
      "when online; the prompt column is data.prompt_column (prompt, as in TRL)", source="ScriptArguments"),
    R("dataset_config", "pick the dataset configuration when you download it (save_to_disk), then point "
      "dataset_name at the folder", source="ScriptArguments"),
    M("dataset_train_split", "data.split", source="ScriptArguments"),
    I("dataset_test_split", "evaluation prompts are eval.data (a file), not a split", source="ScriptArguments"),
    R("dataset_streaming", "prompts are read up front; streaming is not supported", ok=(False, None),
      source="ScriptArguments"),
    I("ignore_bias_buffers", "a DDP workaround TRL's scripts use; not needed", source="ScriptArguments"),
    R("datasets", "dataset mixtures are not supported: concatenate the files", source="DatasetMixtureConfig"),
    R("streaming", "prompts are read up front; streaming is not supported", ok=(False, None),
      source="DatasetMixtureConfig"),
    I("test_split_size", "evaluation prompts are eval.data (a file)", source="DatasetMixtureConfig"),
    M("max_prompt_length", "data.max_prompt_length", "gone from TRL 1.16 (prompts are not cut there); "
      "slimgrpo keeps the last data.max_prompt_length tokens (512), see data.prompt_overflow",
      r._max_prompt_length, source="legacy"),
    M("shuffle_dataset", "data.shuffle"),
    M("train_sampling_strategy", "data.shuffle", "random = shuffle, sequential = dataset order", r._sampling_order,
      source="TrainingArguments"),
    M("chat_template_kwargs", "data.chat_template_kwargs", "passed to the chat template of every prompt and "
      "tool-calling turn (enable_thinking: false)", r._mapping("data.chat_template_kwargs")),
    # ------------------------------------------------------------- rewards (GRPOScriptArguments)
    M("reward_funcs", "rewards.functions", "TRL's registry names (accuracy_reward, think_format_reward, "
      "reasoning_accuracy_reward, get_soft_overlong_punishment) load from trl.rewards; module.function loads "
      "that function (a module file beside the YAML or in the working directory first)", r._reward_list,
      source="GRPOScriptArguments"),
    M("reward_model_name_or_path", "rewards.functions", "a sequence-classification model folder, scored first",
      r._reward_list, source="GRPOScriptArguments"),
    M("reward_weights", "rewards.reward_weights"),
    M("multi_objective_aggregation", "loss.multi_objective_aggregation", _LOSS_NEW),
    # ------------------------------------------------------------- batch and run length
    M("per_device_train_batch_size", "memory.micro_batch_size", "run.batch_size = per_device_train_batch_size x "
      "gradient_accumulation_steps (completions per optimizer step, one process); memory.micro_batch_size = "
      "completions per forward/backward (a memory knob: the update does not depend on it)", r._batch,
      targets=("run.batch_size",), source="TrainingArguments"),
    M("gradient_accumulation_steps", "run.batch_size", "run.batch_size = per_device_train_batch_size x "
      "gradient_accumulation_steps; the micro-batch is memory.micro_batch_size", r._batch,
      targets=("memory.micro_batch_size",), source="TrainingArguments"),
    M("generation_batch_size", "", "accepted when it equals per_device_train_batch_size x "
      "gradient_accumulation_steps; otherwise use steps_per_generation", r._generation_batch_size),
    M("steps_per_generation", "loss.steps_per_generation", "TRL's micro-batches per generated batch / "
      "gradient_accumulation_steps = optimizer steps per generated batch (run.batch_size becomes "
      "per_device_train_batch_size x steps_per_generation)", r._steps_per_generation),
    M("max_steps", "run.max_steps", "TRL -1 = from num_train_epochs. TRL counts optimizer steps, slimgrpo generated "
      "batches, each num_iterations x steps_per_generation / gradient_accumulation_steps optimizer steps: "
      "max_steps is divided by that (rounded up)", r._max_steps, source="TrainingArguments"),
    M("num_train_epochs", "run.num_train_epochs", "used when max_steps is not set (TRL default 3 epochs, "
      "applied when the YAML gives neither)", r._epochs, source="TrainingArguments"),
    M("seed", "run.seed", source="TrainingArguments"),
    I("data_seed", "the prompt order is seeded by seed (run.seed)"),
    M("full_determinism", "run.full_determinism", "deterministic kernels (torch.use_deterministic_algorithms); "
      "on CPU slimgrpo runs repeat bit for bit without it", source="TrainingArguments"),
    M("output_dir", "run.output_dir", "TRL default trainer_output, slimgrpo outputs/run",
      source="TrainingArguments"),
    M("use_cpu", "run.device", "true = cpu", r._use_cpu, source="TrainingArguments"),
    # ------------------------------------------------------------- sampling
    M("num_generations", "rollout.num_generations"),
    M("num_generations_eval", "eval.num_samples", "completions per evaluation prompt"),
    M("max_completion_length", "rollout.max_completion_length", "TRL's 512 where silent (a slimgrpo YAML's "
      "default: 256)"),
    M("temperature", "rollout.temperature", "PPOConfig's default 0.7 applies in PPOTrainer"),
    M("top_p", "rollout.top_p"),
    M("top_k", "rollout.top_k"),
    M("min_p", "rollout.min_p", "None = 0.0 (off)", r._min_p),
    M("repetition_penalty", "rollout.repetition_penalty", "Hugging Face semantics, prompt tokens included"),
    R("generation_kwargs", "extra generate() arguments are not passed; temperature, top_p, top_k, min_p, "
      "repetition_penalty have their own keys (min_new_tokens: rollout.min_completion_length)"),
    I("cache_implementation", "the rollout engine manages its KV cache"),
    M("use_vllm", "rollout.engine", "true = vllm, colocated in the training process (TRL's vllm_mode=colocate); "
      "false leaves slimgrpo's choice (auto)", r._use_vllm),
    M("vllm_mode", "rollout.engine", "colocate only (TRL 1.16's default); server is refused", r._vllm_mode),
    I("vllm_model_impl", "vLLM's own model implementation is used", source="GRPOConfig"),
    M("vllm_enable_sleep_mode", "rollout.vllm_sleep_mode", "TRL default false, slimgrpo true (CUDA only: vLLM "
      "has no sleep mode on CPU)"),
    R("vllm_structured_outputs_regex", "constrained decoding is not supported", source="GRPOConfig"),
    I("vllm_server_base_url", _VLLM_SERVER, source="GRPOConfig"),
    I("vllm_server_host", _VLLM_SERVER, source="GRPOConfig"),
    I("vllm_server_port", _VLLM_SERVER, source="GRPOConfig"),
    I("vllm_server_timeout", _VLLM_SERVER, source="GRPOConfig"),
    I("vllm_group_port", _VLLM_SERVER, source="GRPOConfig"),
    M("vllm_gpu_memory_utilization", "rollout.vllm_gpu_memory_utilization",
      "same default, 0.3; a start-up check only: the KV pool is one step's (rollout.vllm_kv_cache_gb), where TRL's vLLM fills the fraction"),
    I("vllm_max_model_length", "the engine's context is data.max_prompt_length + rollout.max_completion_length",
      source="GRPOConfig"),
    R("vllm_tensor_parallel_size", "one vLLM engine on the training device (no tensor parallelism)",
      ok=(1, None), source="GRPOConfig"),
    M("vllm_importance_sampling_correction", "rollout.importance_sampling_correction", "on by default in both"),
    M("vllm_importance_sampling_mode", "rollout.importance_sampling_mode", "the same four modes, same default "
      "(sequence_mask)"),
    M("vllm_importance_sampling_clip_max", "rollout.importance_sampling_cap", "same default, 3.0",
      r._is_clip_max),
    M("vllm_importance_sampling_clip_min", "rollout.importance_sampling_min", "same default, none"),
    M("vllm_importance_sampling_cap", "rollout.importance_sampling_cap", "TRL's deprecated name of "
      "vllm_importance_sampling_clip_max (it wins over it, as in TRL)", r._sampler_cap),
    I("use_transformers_continuous_batching", "the rollout engine batches itself"),
    I("transformers_continuous_batching_config", "the rollout engine batches itself"),
    I("use_transformers_paged", "the rollout engine batches itself"),
    I("ds3_gather_for_generation", "no DeepSpeed; FSDP2 gathering is distributed.fsdp_generation"),
    M("max_tool_calling_iterations", "rollout.max_tool_calling_iterations", "tools come from rollout.tools or "
      "Trainer(cfg, tools=...), see docs/agents.md"),
    I("pad_to_multiple_of", "padding is internal"),
    # ------------------------------------------------------------- objective
    *_same_name("loss", "beta num_iterations epsilon epsilon_high delta loss_type importance_sampling_level"),
    M("scale_rewards", "loss.scale_rewards", "true = group, false = none", r._scale_rewards),
    M("mask_truncated_completions", "loss.mask_truncated_completions"),
    *_same_name("loss", "use_bias_correction_kl sapo_temperature_neg sapo_temperature_pos vespo_k_pos "
                "vespo_lambda_pos vespo_k_neg vespo_lambda_neg sync_ref_model ref_model_mixup_alpha "
                "ref_model_sync_steps top_entropy_quantile", _LOSS_NEW),
    M("entropy_coef", "loss.entropy_coef", "same meaning as TRL; the mean entropy runs over the whole batch "
      "(TRL: per micro-batch, averaged over accumulation steps; equal with one micro-batch)"),
    *_same_name("loss", "use_adaptive_entropy entropy_coef_min entropy_coef_max entropy_coef_delta entropy_target "
                "off_policy_mask_threshold", _LOSS_NEW),
    I("use_liger_kernel", "always on in effect: log-probs go through the chunked LM head, full logits never "
      "exist (loss.token_chunk, loss.vocab_chunk)"),
    I("liger_kernel_config", "see use_liger_kernel"),
    I("label_smoothing_factor", "not used by GRPO's loss (nor by TRL's)"),
    I("average_tokens_across_devices", "the loss normaliser follows loss.loss_type over the whole step, all "
      "processes included"),
    R("neftune_noise_alpha", "NEFTune embedding noise is not supported"),
    # ------------------------------------------------------------- optimizer and schedule
    M("learning_rate", "optim.learning_rate", source="TrainingArguments"),
    M("lr_scheduler_type", "optim.lr_scheduler_type", "TRL's linear where silent (a slimgrpo YAML's "
      "default: constant); constant_with_warmup = constant", r._scheduler, source="TrainingArguments"),
    R("lr_scheduler_kwargs", "scheduler arguments are not configurable"),
    M("warmup_steps", "optim.warmup_steps", "below 1 = a fraction of the steps, as in transformers",
      source="TrainingArguments"),
    M("warmup_ratio", "optim.warmup_ratio", "transformers < 5 name; same as warmup_steps below 1",
      source="legacy"),
    M("optim", "memory.optimizer", "adamw_torch(_fused) = adamw; adamw_8bit / adamw_bnb_8bit / "
      "paged_adamw_8bit = adamw_8bit", r._optimizer, source="TrainingArguments"),
    R("optim_args", "optimizer arguments beyond the optim.* keys are not configurable"),
    M("weight_decay", "optim.weight_decay", source="TrainingArguments"),
    M("adam_beta1", "optim.adam_beta1", source="TrainingArguments"),
    M("adam_beta2", "optim.adam_beta2", "TRL's 0.999 where silent (a slimgrpo YAML's default: 0.99)", source="TrainingArguments"),
    M("adam_epsilon", "optim.adam_epsilon", source="TrainingArguments"),
    R("optim_target_modules", "GaLore-style optimizers are not supported"),
    M("max_grad_norm", "optim.max_grad_norm", source="TrainingArguments"),
    # ------------------------------------------------------------- memory and precision
    M("gradient_checkpointing", "memory.gradient_checkpointing", "TRL's true where silent (a slimgrpo "
      "YAML's default: false, `slimgrpo plan` says when it is needed)", source="TrainingArguments"),
    M("activation_checkpointing", "memory.gradient_checkpointing", "transformers 5 name",
      lambda v, t: r.SKIP if v is None else bool(v), source="TrainingArguments"),
    I("gradient_checkpointing_kwargs", "slimgrpo chooses the checkpointing flavour itself"),
    I("activation_checkpointing_kwargs", "slimgrpo chooses the checkpointing flavour itself"),
    M("bf16", "model.dtype", "true = weights in bfloat16; full fine-tuning steps them through float32 master "
      "weights (memory.bf16_update=auto with adamw) where TRL keeps float32 weights under bf16 autocast",
      r._precision("bfloat16"), source="TrainingArguments"),
    M("fp16", "model.dtype", "true = weights in float16, with use_peft only (float32 adapters, the loss scaled "
      "dynamically; full fine-tuning refused: no float32 master copy of float16 weights, use bf16)",
      r._precision("float16"), source="TrainingArguments"),
    I("bf16_full_eval", _EVAL), I("fp16_full_eval", _EVAL),
    I("tf32", "slimgrpo leaves torch's TF32 setting as it is"),
    R("torch_compile", "torch.compile of the model is not supported", ok=(False, None)),
    R("torch_compile_backend", "torch.compile of the model is not supported"),
    R("torch_compile_mode", "torch.compile of the model is not supported"),
    I("use_cache", "generation always uses a KV cache, training never"),
    I("torch_empty_cache_steps", "slimgrpo frees memory between stages itself"),
    R("auto_find_batch_size", "TRL rejects it for GRPO too; slimgrpo's answer is memory.budget with "
      "memory.fit=true", ok=(False, None)),
    # ------------------------------------------------------------- logging
    M("logging_steps", "log.logging_steps", "TRL's 10 where silent (a slimgrpo YAML's "
      "default: 1); metrics.jsonl has every step either way", source="TrainingArguments"),
    I("logging_strategy", _LOG), I("logging_first_step", _LOG), I("log_on_each_node", _LOG),
    I("logging_nan_inf_filter", _LOG), I("include_num_input_tokens_seen", _LOG),
    I("log_level", "use slimgrpo --debug for more detail"), I("log_level_replica", _LOG),
    M("disable_tqdm", "log.progress", "true = no progress bar", lambda v, t: r.SKIP if v is None else not v,
      source="TrainingArguments"),
    M("report_to", "log.report_to", source="TrainingArguments"),
    I("run_name", "the run is named after run.output_dir"),
    I("project", _LOG), I("trackio_space_id", _HUB), I("trackio_bucket_id", _HUB),
    I("trackio_static_space_id", _HUB),
    M("log_completions", "log.log_completions_steps", "true = every logging_steps, false = never",
      r._log_completions),
    M("num_completions_to_print", "log.num_completions_to_log", "None = keep slimgrpo's 4",
      lambda v, t: r.SKIP if v is None else int(v)),
    I("log_multimodal", "text only"),
    I("log_unique_prompts", "completions.jsonl keeps every logged row"),
    I("log_completions_hub_repo", _HUB),
    # ------------------------------------------------------------- evaluation
    M("eval_strategy", "eval.steps", "steps = evaluate every eval_steps (default logging_steps)",
      r._eval_strategy, source="TrainingArguments"),
    M("eval_steps", "eval.steps", "used with eval_strategy=steps", r._eval_steps, source="TrainingArguments"),
    I("eval_delay", _EVAL), I("per_device_eval_batch_size", _EVAL), I("prediction_loss_only", _EVAL),
    I("eval_on_start", _EVAL), I("eval_do_concat_batches", _EVAL), I("eval_use_gather_object", _EVAL),
    I("eval_accumulation_steps", _EVAL), I("include_for_metrics", _EVAL), I("batch_eval_metrics", _EVAL),
    I("do_train", "slimgrpo train always trains"), I("do_eval", _EVAL), I("do_predict", _EVAL),
    M("load_best_model_at_end", "run.keep_best", "final/ is the best judgement's model (the evaluation before "
      "training counts too), the last step's goes to last/; needs eval.data or a training-reward best_metric",
      source="TrainingArguments"),
    M("metric_for_best_model", "run.best_metric", "TRL's eval_<name> or <name>: reward -> eval/mean_reward, "
      "rewards/<fn>/mean -> eval/rewards/<fn>, slimgrpo's own names as they are; None (TRL: the eval loss, which "
      "slimgrpo's evaluation has not) keeps eval/accuracy_greedy", r._best_metric, source="TrainingArguments"),
    M("greater_is_better", "run.greater_is_better", "None = true (TRL: true unless the metric is a loss; every "
      "metric slimgrpo names is higher-better)", r._greater_is_better, source="TrainingArguments"),
    M("early_stopping_patience", "run.early_stopping_patience", "EarlyStoppingCallback's argument, given in the "
      "YAML; judgements in a row without improvement (needs load_best_model_at_end, as in TRL)",
      source="EarlyStoppingCallback"),
    M("early_stopping_threshold", "run.early_stopping_threshold", "EarlyStoppingCallback's argument: the "
      "improvement that resets the patience", lambda v, t: r.SKIP if v is None else float(v),
      source="EarlyStoppingCallback"),
    # ------------------------------------------------------------- checkpoints
    M("save_strategy", "run.save_checkpoints", "steps = every save_steps; no = no checkpoints",
      r._save_strategy, source="TrainingArguments"),
    M("save_steps", "run.save_steps", "TRL's 500 where silent (a slimgrpo YAML's default: 0 = at the end only)", r._save_steps,
      source="TrainingArguments"),
    M("save_total_limit", "run.save_total_limit", "None (TRL: keep all) keeps slimgrpo's 2", r._save_total_limit,
      source="TrainingArguments"),
    I("save_only_model", "checkpoints always hold what an exact resume needs; the final/ folder is the model"),
    I("save_on_each_node", "rank 0 writes checkpoints"),
    I("enable_jit_checkpoint", "slimgrpo checkpoints on SIGTERM/SIGINT by itself"),
    M("resume_from_checkpoint", "run.resume", "a path, or true = the newest checkpoint; TRL starts fresh "
      "by default while slimgrpo's run.resume=auto continues a run folder that has checkpoints", r._resume,
      source="TrainingArguments"),
    I("ignore_data_skip", "resume restores the exact prompt position"),
    I("restore_callback_states_from_checkpoint", "no callback state to restore"),
    R("push_to_hub", _HUB, ok=(False, None)),
    I("hub_token", _HUB), I("hub_private_repo", _HUB), I("hub_model_id", _HUB), I("hub_strategy", _HUB),
    I("hub_always_push", _HUB), I("hub_revision", _HUB),
    # ------------------------------------------------------------- processes
    M("fsdp", "distributed.strategy", "any FSDP setting = fsdp (FSDP2 fully_shard)", r._fsdp,
      source="TrainingArguments"),
    I("fsdp_config", "FSDP2 is configured by distributed.*"),
    R("deepspeed", "DeepSpeed is not supported: use distributed.strategy=fsdp"),
    R("accelerator_config", "no Accelerate: torchrun + distributed.*"),
    R("parallelism_config", "only data parallelism (DDP) and FSDP2 are supported"),
    M("ddp_backend", "distributed.backend", transform=r._backend, source="TrainingArguments"),
    M("ddp_timeout", "distributed.timeout_s", source="TrainingArguments"),
    I("ddp_find_unused_parameters", _DDP), I("ddp_bucket_cap_mb", _DDP), I("ddp_broadcast_buffers", _DDP),
    I("ddp_static_graph", _DDP), I("local_rank", "set by torchrun"),
    I("dataloader_drop_last", _LOADER), I("dataloader_num_workers", _LOADER), I("dataloader_pin_memory", _LOADER),
    I("dataloader_persistent_workers", _LOADER), I("dataloader_prefetch_factor", _LOADER),
    I("dataloader_multiprocessing_context", _LOADER), I("dataloader_in_order", _LOADER),
    I("remove_unused_columns", "every dataset column reaches the reward functions, as in TRL's GRPO"),
    I("label_names", "GRPO has no labels"), I("length_column_name", "no length-grouped sampling"),
    I("debug", "use slimgrpo --debug"), I("skip_memory_metrics", "memory/peak_mib is always logged"),
    # ------------------------------------------------------------- PPO (TRL 1.12's PPOConfig, docs/ppo.md)
    # slimgrpo.trl.PPOTrainer passes these at their TRL values, set or not: PPO's run is TRL's PPO.
    M("num_ppo_epochs", "loss.num_iterations", "passes over one rollout; TRL's default 4 applies in PPOTrainer",
      source="PPOConfig"),
    M("num_mini_batches", "loss.steps_per_generation", "mini-batches per rollout, one optimizer step each",
      source="PPOConfig"),
    M("cliprange", "loss.epsilon", "the policy clip (GRPO's name kept: one key per meaning)", source="PPOConfig"),
    M("kl_coef", "loss.kl_coef", "the KL to the reference as a per-token reward penalty (k1)", source="PPOConfig"),
    R("kl_estimator", "slimgrpo's KL reward is k1, -kl_coef * (logp - logp_ref) per token; for a k3 KL put it "
      "in the loss instead (loss.beta, GRPO's term, with kl_coef=0)", ok=("k1",), source="PPOConfig"),
    M("vf_coef", "critic.vf_coef", _LOSS_NEW, source="PPOConfig"),
    M("cliprange_value", "critic.cliprange_value", _LOSS_NEW, source="PPOConfig"),
    M("gamma", "loss.gamma", _LOSS_NEW, source="PPOConfig"),
    M("lam", "loss.lam", _LOSS_NEW, source="PPOConfig"),
    M("whiten_rewards", "loss.whiten_rewards", _LOSS_NEW, source="PPOConfig"),
    M("response_length", "rollout.max_completion_length", "TRL's default 53 applies in PPOTrainer",
      source="PPOConfig"),
    M("total_episodes", "run.max_steps", "episodes are completions (one per prompt): ceil(total_episodes / "
      "run.batch_size) rollouts; None = num_train_epochs passes over the prompts. TRL 1.12's PPO never reads "
      "max_steps; slimgrpo honours it when total_episodes is not set", r._total_episodes, source="PPOConfig"),
    M("stop_token", "", "slimgrpo always ends a completion at the tokenizer's EOS, which is TRL's stop_token="
      "'eos'; TRL's default None samples response_length tokens, past any EOS", r._stop_token,
      source="PPOConfig"),
    M("stop_token_id", "", "set as the policy's generation_config.eos_token_id, as TRL does: a completion ends "
      "there or at the tokenizer's EOS", lambda v, t: r.SKIP, source="PPOConfig"),
    M("missing_eos_penalty", "", "PPOTrainer subtracts it from the reward model's score of a completion without "
      "the tokenizer's EOS, as TRL does", lambda v, t: r.SKIP, source="PPOConfig"),
    M("local_rollout_forward_batch_size", "rollout.max_batch_rows", "completions generated at once (a memory "
      "knob); the update's forward batch is memory.micro_batch_size", source="PPOConfig"),
    I("num_sample_generations", "TRL prints sample tables during training; slimgrpo writes completions.jsonl "
      "(log.log_completions_steps) and PPOTrainer.generate_completions() prints the eval set's",
      source="PPOConfig"),
    I("sft_model_path", "read by the script (TRL's ppo.py loads the policy from it); the trainer takes the "
      "loaded model", source="PPOConfig"),
    I("reward_model_path", "read by the script (ppo.py loads the reward and value models from it); the trainer "
      "takes the loaded models", source="PPOConfig"),
    I("dataset_num_proc", "read by the script (dataset.map); slimgrpo reads the tokenized rows as they are",
      source="PPOConfig"),
    R("model_adapter_name", "slimgrpo trains the one adapter it adds; named adapters are not supported",
      source="PPOConfig"),
    R("ref_adapter_name", "slimgrpo's LoRA reference is the base with the adapters off (no reference adapter)",
      source="PPOConfig"),
    *[I(key, "TRL computes it from the batch settings and the processes; set those instead", source="PPOConfig")
      for key in ("world_size", "num_total_batches", "micro_batch_size", "local_batch_size", "batch_size",
                  "local_mini_batch_size", "mini_batch_size")],
]

BY_KEY: dict[str, r.Rule] = {rule.key: rule for rule in RULES}
assert len(BY_KEY) == len(RULES), "a TRL key has two rules"


def hint_for(key: str) -> str | None:
    """A sentence for a TRL key written in a slimgrpo config (``bf16``, ``gradient_accumulation_steps``): what
    slimgrpo calls it, or why it has no key. None for a key that is not TRL's."""
    rule = BY_KEY.get(key)
    if rule is None:
        return None
    if rule.kind == "map" and rule.targets:
        note = f" ({rule.note})" if rule.note else ""
        return f"{key!r} is TRL's name: in slimgrpo use {' and '.join(rule.targets)}{note}."
    if rule.kind == "map":
        return f"{key!r} is TRL's: {rule.note}."
    return f"{key!r} is TRL's and has no slimgrpo key: {rule.note}."
