"""TRL key -> the sentence an unknown-key error adds when a slimgrpo config uses that TRL name
(``bf16``, ``gradient_accumulation_steps``): what slimgrpo calls it, or why it has no key.

Generated from slimgrpo.trl_compat.RULES by scripts/gen_trl_migration.py: do not edit by hand (a test
checks it is up to date). The config layer owns the sentences as data so that it never imports
trl_compat, which imports config (docs/architecture.md)."""

TRL_KEY_HINTS: dict[str, str] = {
    'accelerator_config':
        "'accelerator_config' is TRL's and has no slimgrpo key: no Accelerate: torchrun + distributed.*.",
    'activation_checkpointing':
        "'activation_checkpointing' is TRL's name: in slimgrpo use memory.gradient_checkpointing (transformers 5 "
        'name).',
    'activation_checkpointing_kwargs':
        "'activation_checkpointing_kwargs' is TRL's and has no slimgrpo key: slimgrpo chooses the checkpointing "
        'flavour itself.',
    'adam_beta1':
        "'adam_beta1' is TRL's name: in slimgrpo use optim.adam_beta1.",
    'adam_beta2':
        "'adam_beta2' is TRL's name: in slimgrpo use optim.adam_beta2 (TRL default 0.999, slimgrpo 0.99).",
    'adam_epsilon':
        "'adam_epsilon' is TRL's name: in slimgrpo use optim.adam_epsilon.",
    'attn_implementation':
        "'attn_implementation' is TRL's name: in slimgrpo use model.attn_implementation (TRL default None "
        '(transformers picks); slimgrpo sdpa. flash_attention_2 needs the flash-attn package (checked before '
        'loading)).',
    'auto_find_batch_size':
        "'auto_find_batch_size' is TRL's and has no slimgrpo key: TRL rejects it for GRPO too; slimgrpo's answer is "
        'memory.budget with memory.fit=true.',
    'average_tokens_across_devices':
        "'average_tokens_across_devices' is TRL's and has no slimgrpo key: the loss normaliser follows loss.loss_type"
        ' over the whole step, all processes included.',
    'batch_eval_metrics':
        "'batch_eval_metrics' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'beta':
        "'beta' is TRL's name: in slimgrpo use loss.beta.",
    'bf16':
        "'bf16' is TRL's name: in slimgrpo use model.dtype (true = weights in bfloat16; full fine-tuning steps them "
        'through float32 master weights (memory.bf16_update=auto with adamw) where TRL keeps float32 weights under '
        'bf16 autocast).',
    'bf16_full_eval':
        "'bf16_full_eval' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'bnb_4bit_quant_storage':
        "'bnb_4bit_quant_storage' is TRL's and has no slimgrpo key: the storage dtype of 4-bit weights is not "
        'configurable.',
    'bnb_4bit_quant_type':
        "'bnb_4bit_quant_type' is TRL's name: in slimgrpo use model.load_in_4bit (NF4 only).",
    'cache_implementation':
        "'cache_implementation' is TRL's and has no slimgrpo key: the rollout engine manages its KV cache.",
    'cast_lm_head_to_fp32':
        "'cast_lm_head_to_fp32' is TRL's and has no slimgrpo key: always on in effect: the chunked LM head "
        'accumulates log-probs in float32.',
    'chat_template_kwargs':
        "'chat_template_kwargs' is TRL's and has no slimgrpo key: not passed to the chat template: set "
        'data.chat_template to a template that renders what you need (e.g. without thinking).',
    'data_seed':
        "'data_seed' is TRL's and has no slimgrpo key: the prompt order is seeded by seed (run.seed).",
    'dataloader_drop_last':
        "'dataloader_drop_last' is TRL's and has no slimgrpo key: prompts are read and tokenized up front; there is "
        'no DataLoader to tune.',
    'dataloader_in_order':
        "'dataloader_in_order' is TRL's and has no slimgrpo key: prompts are read and tokenized up front; there is no"
        ' DataLoader to tune.',
    'dataloader_multiprocessing_context':
        "'dataloader_multiprocessing_context' is TRL's and has no slimgrpo key: prompts are read and tokenized up "
        'front; there is no DataLoader to tune.',
    'dataloader_num_workers':
        "'dataloader_num_workers' is TRL's and has no slimgrpo key: prompts are read and tokenized up front; there is"
        ' no DataLoader to tune.',
    'dataloader_persistent_workers':
        "'dataloader_persistent_workers' is TRL's and has no slimgrpo key: prompts are read and tokenized up front; "
        'there is no DataLoader to tune.',
    'dataloader_pin_memory':
        "'dataloader_pin_memory' is TRL's and has no slimgrpo key: prompts are read and tokenized up front; there is "
        'no DataLoader to tune.',
    'dataloader_prefetch_factor':
        "'dataloader_prefetch_factor' is TRL's and has no slimgrpo key: prompts are read and tokenized up front; "
        'there is no DataLoader to tune.',
    'dataset_config':
        "'dataset_config' is TRL's and has no slimgrpo key: pick the dataset configuration when you download it "
        '(save_to_disk), then point dataset_name at the folder.',
    'dataset_name':
        "'dataset_name' is TRL's name: in slimgrpo use data.path (a .jsonl/.json/.parquet/.csv file, a save_to_disk "
        'folder, or a hub name when online; the prompt column is data.prompt_column (prompt, as in TRL)).',
    'dataset_streaming':
        "'dataset_streaming' is TRL's and has no slimgrpo key: prompts are read up front; streaming is not supported.",
    'dataset_test_split':
        "'dataset_test_split' is TRL's and has no slimgrpo key: evaluation prompts are eval.data (a file), not a "
        'split.',
    'dataset_train_split':
        "'dataset_train_split' is TRL's name: in slimgrpo use data.split.",
    'datasets':
        "'datasets' is TRL's and has no slimgrpo key: dataset mixtures are not supported: concatenate the files.",
    'ddp_backend':
        "'ddp_backend' is TRL's name: in slimgrpo use distributed.backend.",
    'ddp_broadcast_buffers':
        "'ddp_broadcast_buffers' is TRL's and has no slimgrpo key: slimgrpo's DDP wrapper chooses this itself.",
    'ddp_bucket_cap_mb':
        "'ddp_bucket_cap_mb' is TRL's and has no slimgrpo key: slimgrpo's DDP wrapper chooses this itself.",
    'ddp_find_unused_parameters':
        "'ddp_find_unused_parameters' is TRL's and has no slimgrpo key: slimgrpo's DDP wrapper chooses this itself.",
    'ddp_static_graph':
        "'ddp_static_graph' is TRL's and has no slimgrpo key: slimgrpo's DDP wrapper chooses this itself.",
    'ddp_timeout':
        "'ddp_timeout' is TRL's name: in slimgrpo use distributed.timeout_s.",
    'debug':
        "'debug' is TRL's and has no slimgrpo key: use slimgrpo --debug.",
    'deepspeed':
        "'deepspeed' is TRL's and has no slimgrpo key: DeepSpeed is not supported: use distributed.strategy=fsdp.",
    'delta':
        "'delta' is TRL's name: in slimgrpo use loss.delta.",
    'disable_dropout':
        "'disable_dropout' is TRL's name: in slimgrpo use model.disable_dropout (same name and meaning as TRL).",
    'disable_tqdm':
        "'disable_tqdm' is TRL's name: in slimgrpo use log.progress (true = no progress bar).",
    'do_eval':
        "'do_eval' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'do_predict':
        "'do_predict' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'do_train':
        "'do_train' is TRL's and has no slimgrpo key: slimgrpo train always trains.",
    'ds3_gather_for_generation':
        "'ds3_gather_for_generation' is TRL's and has no slimgrpo key: no DeepSpeed; FSDP2 gathering is "
        'distributed.fsdp_generation.',
    'dtype':
        "'dtype' is TRL's name: in slimgrpo use model.dtype (TRL's ModelConfig default float32; slimgrpo's auto = "
        'bfloat16 on GPUs that have it, float32 on CPU).',
    'early_stopping_patience':
        "'early_stopping_patience' is TRL's name: in slimgrpo use run.early_stopping_patience "
        "(EarlyStoppingCallback's argument, given in the YAML; judgements in a row without improvement (needs "
        'load_best_model_at_end, as in TRL)).',
    'early_stopping_threshold':
        "'early_stopping_threshold' is TRL's name: in slimgrpo use run.early_stopping_threshold "
        "(EarlyStoppingCallback's argument: the improvement that resets the patience).",
    'enable_jit_checkpoint':
        "'enable_jit_checkpoint' is TRL's and has no slimgrpo key: slimgrpo checkpoints on SIGTERM/SIGINT by itself.",
    'entropy_coef':
        "'entropy_coef' is TRL's name: in slimgrpo use loss.entropy_coef (same meaning as TRL; the mean entropy runs "
        'over the whole batch (TRL: per micro-batch, averaged over accumulation steps; equal with one micro-batch)).',
    'entropy_coef_delta':
        "'entropy_coef_delta' is TRL's name: in slimgrpo use loss.entropy_coef_delta (same name and meaning as TRL).",
    'entropy_coef_max':
        "'entropy_coef_max' is TRL's name: in slimgrpo use loss.entropy_coef_max (same name and meaning as TRL).",
    'entropy_coef_min':
        "'entropy_coef_min' is TRL's name: in slimgrpo use loss.entropy_coef_min (same name and meaning as TRL).",
    'entropy_target':
        "'entropy_target' is TRL's name: in slimgrpo use loss.entropy_target (same name and meaning as TRL).",
    'epsilon':
        "'epsilon' is TRL's name: in slimgrpo use loss.epsilon.",
    'epsilon_high':
        "'epsilon_high' is TRL's name: in slimgrpo use loss.epsilon_high.",
    'eval_accumulation_steps':
        "'eval_accumulation_steps' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps "
        '/ eval.num_samples; this knob has no counterpart.',
    'eval_delay':
        "'eval_delay' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'eval_do_concat_batches':
        "'eval_do_concat_batches' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps /"
        ' eval.num_samples; this knob has no counterpart.',
    'eval_on_start':
        "'eval_on_start' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'eval_steps':
        "'eval_steps' is TRL's name: in slimgrpo use eval.steps (used with eval_strategy=steps).",
    'eval_strategy':
        "'eval_strategy' is TRL's name: in slimgrpo use eval.steps (steps = evaluate every eval_steps (default "
        'logging_steps)).',
    'eval_use_gather_object':
        "'eval_use_gather_object' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps /"
        ' eval.num_samples; this knob has no counterpart.',
    'fp16':
        "'fp16' is TRL's name: in slimgrpo use model.dtype (true = weights in float16, with use_peft only (float32 "
        'adapters, the loss scaled dynamically; full fine-tuning refused: no float32 master copy of float16 weights, '
        'use bf16)).',
    'fp16_full_eval':
        "'fp16_full_eval' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'fsdp':
        "'fsdp' is TRL's name: in slimgrpo use distributed.strategy (any FSDP setting = fsdp (FSDP2 fully_shard)).",
    'fsdp_config':
        "'fsdp_config' is TRL's and has no slimgrpo key: FSDP2 is configured by distributed.*.",
    'full_determinism':
        "'full_determinism' is TRL's name: in slimgrpo use run.full_determinism (deterministic kernels "
        '(torch.use_deterministic_algorithms); on CPU slimgrpo runs repeat bit for bit without it).',
    'generation_batch_size':
        "'generation_batch_size' is TRL's: accepted when it equals per_device_train_batch_size x "
        'gradient_accumulation_steps; otherwise use steps_per_generation.',
    'generation_kwargs':
        "'generation_kwargs' is TRL's and has no slimgrpo key: extra generate() arguments are not passed; "
        'temperature, top_p, top_k, min_p, repetition_penalty have their own keys (min_new_tokens: '
        'rollout.min_completion_length).',
    'gradient_accumulation_steps':
        "'gradient_accumulation_steps' is TRL's name: in slimgrpo use run.batch_size and memory.micro_batch_size "
        '(run.batch_size = per_device_train_batch_size x gradient_accumulation_steps; the micro-batch is '
        'memory.micro_batch_size).',
    'gradient_checkpointing':
        "'gradient_checkpointing' is TRL's name: in slimgrpo use memory.gradient_checkpointing (TRL default true, "
        'slimgrpo false: `slimgrpo plan` says when it is needed and small runs are faster without).',
    'gradient_checkpointing_kwargs':
        "'gradient_checkpointing_kwargs' is TRL's and has no slimgrpo key: slimgrpo chooses the checkpointing flavour"
        ' itself.',
    'greater_is_better':
        "'greater_is_better' is TRL's name: in slimgrpo use run.greater_is_better (None = true (TRL: true unless the "
        'metric is a loss; every metric slimgrpo names is higher-better)).',
    'hub_always_push':
        "'hub_always_push' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'hub_model_id':
        "'hub_model_id' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'hub_private_repo':
        "'hub_private_repo' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'hub_revision':
        "'hub_revision' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'hub_strategy':
        "'hub_strategy' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'hub_token':
        "'hub_token' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder yourself.",
    'ignore_bias_buffers':
        "'ignore_bias_buffers' is TRL's and has no slimgrpo key: a DDP workaround TRL's scripts use; not needed.",
    'ignore_data_skip':
        "'ignore_data_skip' is TRL's and has no slimgrpo key: resume restores the exact prompt position.",
    'importance_sampling_level':
        "'importance_sampling_level' is TRL's name: in slimgrpo use loss.importance_sampling_level.",
    'include_for_metrics':
        "'include_for_metrics' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'include_num_input_tokens_seen':
        "'include_num_input_tokens_seen' is TRL's and has no slimgrpo key: slimgrpo writes every step to "
        'metrics.jsonl and the log.report_to backends.',
    'label_names':
        "'label_names' is TRL's and has no slimgrpo key: GRPO has no labels.",
    'label_smoothing_factor':
        "'label_smoothing_factor' is TRL's and has no slimgrpo key: not used by GRPO's loss (nor by TRL's).",
    'learning_rate':
        "'learning_rate' is TRL's name: in slimgrpo use optim.learning_rate.",
    'length_column_name':
        "'length_column_name' is TRL's and has no slimgrpo key: no length-grouped sampling.",
    'liger_kernel_config':
        "'liger_kernel_config' is TRL's and has no slimgrpo key: see use_liger_kernel.",
    'load_best_model_at_end':
        "'load_best_model_at_end' is TRL's name: in slimgrpo use run.keep_best (final/ is the best judgement's model "
        "(the evaluation before training counts too), the last step's goes to last/; needs eval.data or a training-"
        'reward best_metric).',
    'load_in_4bit':
        "'load_in_4bit' is TRL's name: in slimgrpo use model.load_in_4bit (QLoRA, CUDA only, needs use_peft).",
    'load_in_8bit':
        "'load_in_8bit' is TRL's and has no slimgrpo key: 8-bit base weights are not supported; use load_in_4bit "
        '(QLoRA).',
    'local_rank':
        "'local_rank' is TRL's and has no slimgrpo key: set by torchrun.",
    'log_completions':
        "'log_completions' is TRL's name: in slimgrpo use log.log_completions_steps (true = every logging_steps, "
        'false = never).',
    'log_completions_hub_repo':
        "'log_completions_hub_repo' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ "
        'folder yourself.',
    'log_level':
        "'log_level' is TRL's and has no slimgrpo key: use slimgrpo --debug for more detail.",
    'log_level_replica':
        "'log_level_replica' is TRL's and has no slimgrpo key: slimgrpo writes every step to metrics.jsonl and the "
        'log.report_to backends.',
    'log_multimodal':
        "'log_multimodal' is TRL's and has no slimgrpo key: text only.",
    'log_on_each_node':
        "'log_on_each_node' is TRL's and has no slimgrpo key: slimgrpo writes every step to metrics.jsonl and the "
        'log.report_to backends.',
    'log_unique_prompts':
        "'log_unique_prompts' is TRL's and has no slimgrpo key: completions.jsonl keeps every logged row.",
    'logging_first_step':
        "'logging_first_step' is TRL's and has no slimgrpo key: slimgrpo writes every step to metrics.jsonl and the "
        'log.report_to backends.',
    'logging_nan_inf_filter':
        "'logging_nan_inf_filter' is TRL's and has no slimgrpo key: slimgrpo writes every step to metrics.jsonl and "
        'the log.report_to backends.',
    'logging_steps':
        "'logging_steps' is TRL's name: in slimgrpo use log.logging_steps (TRL default 10, slimgrpo 1: a console line"
        ' every step; metrics.jsonl has every step either way).',
    'logging_strategy':
        "'logging_strategy' is TRL's and has no slimgrpo key: slimgrpo writes every step to metrics.jsonl and the "
        'log.report_to backends.',
    'lora_alpha':
        "'lora_alpha' is TRL's name: in slimgrpo use lora.alpha.",
    'lora_dropout':
        "'lora_dropout' is TRL's name: in slimgrpo use lora.dropout (TRL default 0.05, slimgrpo 0.0).",
    'lora_modules_to_save':
        "'lora_modules_to_save' is TRL's and has no slimgrpo key: extra fully-trained modules are not supported with "
        'LoRA.',
    'lora_r':
        "'lora_r' is TRL's name: in slimgrpo use lora.r.",
    'lora_target_modules':
        "'lora_target_modules' is TRL's name: in slimgrpo use lora.target_modules (TRL's None = peft's per-"
        "architecture default (attention projections); slimgrpo's default is all-linear).",
    'lora_target_parameters':
        "'lora_target_parameters' is TRL's and has no slimgrpo key: LoRA on parameters (MoE experts) is not "
        'supported.',
    'lora_task_type':
        "'lora_task_type' is TRL's and has no slimgrpo key: slimgrpo trains causal LMs only.",
    'loss_type':
        "'loss_type' is TRL's name: in slimgrpo use loss.loss_type.",
    'lr_scheduler_kwargs':
        "'lr_scheduler_kwargs' is TRL's and has no slimgrpo key: scheduler arguments are not configurable.",
    'lr_scheduler_type':
        "'lr_scheduler_type' is TRL's name: in slimgrpo use optim.lr_scheduler_type (TRL default linear, slimgrpo "
        'constant; constant_with_warmup = constant).',
    'mask_truncated_completions':
        "'mask_truncated_completions' is TRL's name: in slimgrpo use loss.mask_truncated_completions.",
    'max_completion_length':
        "'max_completion_length' is TRL's name: in slimgrpo use rollout.max_completion_length (TRL default 512, "
        'slimgrpo 256 (a shorter first run that shows the plan; raise it for reasoning)).',
    'max_grad_norm':
        "'max_grad_norm' is TRL's name: in slimgrpo use optim.max_grad_norm.",
    'max_prompt_length':
        "'max_prompt_length' is TRL's name: in slimgrpo use data.max_prompt_length (gone from TRL 1.16 (prompts are "
        'not cut there); slimgrpo keeps the last data.max_prompt_length tokens (512), see data.prompt_overflow).',
    'max_steps':
        "'max_steps' is TRL's name: in slimgrpo use run.max_steps (TRL -1 = from num_train_epochs).",
    'max_tool_calling_iterations':
        "'max_tool_calling_iterations' is TRL's name: in slimgrpo use rollout.max_tool_calling_iterations (tools come"
        ' from rollout.tools or Trainer(cfg, tools=...), see docs/agents.md).',
    'metric_for_best_model':
        "'metric_for_best_model' is TRL's name: in slimgrpo use run.best_metric (TRL's eval_<name> or <name>: reward "
        "-> eval/mean_reward, rewards/<fn>/mean -> eval/rewards/<fn>, slimgrpo's own names as they are; None (TRL: "
        "the eval loss, which slimgrpo's evaluation has not) keeps eval/accuracy_greedy).",
    'min_p':
        "'min_p' is TRL's name: in slimgrpo use rollout.min_p (None = 0.0 (off)).",
    'model_init_kwargs':
        "'model_init_kwargs' is TRL's name: in slimgrpo use model.dtype and model.attn_implementation and "
        'model.trust_remote_code (dtype/torch_dtype, attn_implementation, trust_remote_code are read; other keys '
        'refused).',
    'model_name_or_path':
        "'model_name_or_path' is TRL's name: in slimgrpo use model.path (a local folder, or a hub name when online).",
    'model_revision':
        "'model_revision' is TRL's and has no slimgrpo key: slimgrpo loads a folder as it is; download the revision "
        'first.',
    'multi_objective_aggregation':
        "'multi_objective_aggregation' is TRL's name: in slimgrpo use loss.multi_objective_aggregation (same name and"
        ' meaning as TRL).',
    'neftune_noise_alpha':
        "'neftune_noise_alpha' is TRL's and has no slimgrpo key: NEFTune embedding noise is not supported.",
    'num_completions_to_print':
        "'num_completions_to_print' is TRL's name: in slimgrpo use log.num_completions_to_log (None = keep slimgrpo's"
        ' 4).',
    'num_generations':
        "'num_generations' is TRL's name: in slimgrpo use rollout.num_generations.",
    'num_generations_eval':
        "'num_generations_eval' is TRL's name: in slimgrpo use eval.num_samples (completions per evaluation prompt).",
    'num_iterations':
        "'num_iterations' is TRL's name: in slimgrpo use loss.num_iterations.",
    'num_train_epochs':
        "'num_train_epochs' is TRL's name: in slimgrpo use run.num_train_epochs (used when max_steps is not set (TRL "
        'default 3 epochs, applied when the YAML gives neither)).',
    'off_policy_mask_threshold':
        "'off_policy_mask_threshold' is TRL's name: in slimgrpo use loss.off_policy_mask_threshold (same name and "
        'meaning as TRL).',
    'optim':
        "'optim' is TRL's name: in slimgrpo use memory.optimizer (adamw_torch(_fused) = adamw; adamw_8bit / "
        'adamw_bnb_8bit / paged_adamw_8bit = adamw_8bit).',
    'optim_args':
        "'optim_args' is TRL's and has no slimgrpo key: optimizer arguments beyond the optim.* keys are not "
        'configurable.',
    'optim_target_modules':
        "'optim_target_modules' is TRL's and has no slimgrpo key: GaLore-style optimizers are not supported.",
    'output_dir':
        "'output_dir' is TRL's name: in slimgrpo use run.output_dir (TRL default trainer_output, slimgrpo "
        'outputs/run).',
    'pad_to_multiple_of':
        "'pad_to_multiple_of' is TRL's and has no slimgrpo key: padding is internal.",
    'parallelism_config':
        "'parallelism_config' is TRL's and has no slimgrpo key: only data parallelism (DDP) and FSDP2 are supported.",
    'per_device_eval_batch_size':
        "'per_device_eval_batch_size' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / "
        'eval.steps / eval.num_samples; this knob has no counterpart.',
    'per_device_train_batch_size':
        "'per_device_train_batch_size' is TRL's name: in slimgrpo use memory.micro_batch_size and run.batch_size "
        '(run.batch_size = per_device_train_batch_size x gradient_accumulation_steps (completions per optimizer step,'
        ' one process); memory.micro_batch_size = completions per forward/backward (a memory knob: the update does '
        'not depend on it)).',
    'prediction_loss_only':
        "'prediction_loss_only' is TRL's and has no slimgrpo key: slimgrpo's evaluation is eval.data / eval.steps / "
        'eval.num_samples; this knob has no counterpart.',
    'project':
        "'project' is TRL's and has no slimgrpo key: slimgrpo writes every step to metrics.jsonl and the "
        'log.report_to backends.',
    'push_to_hub':
        "'push_to_hub' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'ref_model_mixup_alpha':
        "'ref_model_mixup_alpha' is TRL's name: in slimgrpo use loss.ref_model_mixup_alpha (same name and meaning as "
        'TRL).',
    'ref_model_sync_steps':
        "'ref_model_sync_steps' is TRL's name: in slimgrpo use loss.ref_model_sync_steps (same name and meaning as "
        'TRL).',
    'remove_unused_columns':
        "'remove_unused_columns' is TRL's and has no slimgrpo key: every dataset column reaches the reward functions,"
        " as in TRL's GRPO.",
    'repetition_penalty':
        "'repetition_penalty' is TRL's name: in slimgrpo use rollout.repetition_penalty (Hugging Face semantics, "
        'prompt tokens included).',
    'report_to':
        "'report_to' is TRL's name: in slimgrpo use log.report_to.",
    'restore_callback_states_from_checkpoint':
        "'restore_callback_states_from_checkpoint' is TRL's and has no slimgrpo key: no callback state to restore.",
    'resume_from_checkpoint':
        "'resume_from_checkpoint' is TRL's name: in slimgrpo use run.resume (a path, or true = the newest checkpoint;"
        " TRL starts fresh by default while slimgrpo's run.resume=auto continues a run folder that has checkpoints).",
    'reward_funcs':
        "'reward_funcs' is TRL's name: in slimgrpo use rewards.functions (TRL's registry names (accuracy_reward, "
        'think_format_reward, reasoning_accuracy_reward, get_soft_overlong_punishment) load from trl.rewards; '
        'module.function loads that function (a module file beside the YAML or in the working directory first)).',
    'reward_model_name_or_path':
        "'reward_model_name_or_path' is TRL's name: in slimgrpo use rewards.functions (a sequence-classification "
        'model folder, scored first).',
    'reward_weights':
        "'reward_weights' is TRL's name: in slimgrpo use rewards.reward_weights.",
    'router_aux_loss_coef':
        "'router_aux_loss_coef' is TRL's and has no slimgrpo key: the MoE router auxiliary loss is not added.",
    'run_name':
        "'run_name' is TRL's and has no slimgrpo key: the run is named after run.output_dir.",
    'sapo_temperature_neg':
        "'sapo_temperature_neg' is TRL's name: in slimgrpo use loss.sapo_temperature_neg (same name and meaning as "
        'TRL).',
    'sapo_temperature_pos':
        "'sapo_temperature_pos' is TRL's name: in slimgrpo use loss.sapo_temperature_pos (same name and meaning as "
        'TRL).',
    'save_on_each_node':
        "'save_on_each_node' is TRL's and has no slimgrpo key: rank 0 writes checkpoints.",
    'save_only_model':
        "'save_only_model' is TRL's and has no slimgrpo key: checkpoints always hold what an exact resume needs; the "
        'final/ folder is the model.',
    'save_steps':
        "'save_steps' is TRL's name: in slimgrpo use run.save_steps (TRL default 500; slimgrpo 0 = only at the end).",
    'save_strategy':
        "'save_strategy' is TRL's name: in slimgrpo use run.save_checkpoints (steps = every save_steps; no = no "
        'checkpoints).',
    'save_total_limit':
        "'save_total_limit' is TRL's name: in slimgrpo use run.save_total_limit (None (TRL: keep all) keeps "
        "slimgrpo's 2).",
    'scale_rewards':
        "'scale_rewards' is TRL's name: in slimgrpo use loss.scale_rewards (true = group, false = none).",
    'seed':
        "'seed' is TRL's name: in slimgrpo use run.seed.",
    'shuffle_dataset':
        "'shuffle_dataset' is TRL's name: in slimgrpo use data.shuffle.",
    'skip_memory_metrics':
        "'skip_memory_metrics' is TRL's and has no slimgrpo key: memory/peak_mib is always logged.",
    'steps_per_generation':
        "'steps_per_generation' is TRL's name: in slimgrpo use loss.steps_per_generation (same name and meaning as "
        'TRL).',
    'streaming':
        "'streaming' is TRL's and has no slimgrpo key: prompts are read up front; streaming is not supported.",
    'sync_ref_model':
        "'sync_ref_model' is TRL's name: in slimgrpo use loss.sync_ref_model (same name and meaning as TRL).",
    'temperature':
        "'temperature' is TRL's name: in slimgrpo use rollout.temperature.",
    'test_split_size':
        "'test_split_size' is TRL's and has no slimgrpo key: evaluation prompts are eval.data (a file).",
    'tf32':
        "'tf32' is TRL's and has no slimgrpo key: slimgrpo leaves torch's TF32 setting as it is.",
    'top_entropy_quantile':
        "'top_entropy_quantile' is TRL's name: in slimgrpo use loss.top_entropy_quantile (same name and meaning as "
        'TRL).',
    'top_k':
        "'top_k' is TRL's name: in slimgrpo use rollout.top_k.",
    'top_p':
        "'top_p' is TRL's name: in slimgrpo use rollout.top_p.",
    'torch_compile':
        "'torch_compile' is TRL's and has no slimgrpo key: torch.compile of the model is not supported.",
    'torch_compile_backend':
        "'torch_compile_backend' is TRL's and has no slimgrpo key: torch.compile of the model is not supported.",
    'torch_compile_mode':
        "'torch_compile_mode' is TRL's and has no slimgrpo key: torch.compile of the model is not supported.",
    'torch_dtype':
        "'torch_dtype' is TRL's name: in slimgrpo use model.dtype (older name of dtype).",
    'torch_empty_cache_steps':
        "'torch_empty_cache_steps' is TRL's and has no slimgrpo key: slimgrpo frees memory between stages itself.",
    'trackio_bucket_id':
        "'trackio_bucket_id' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'trackio_space_id':
        "'trackio_space_id' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ folder "
        'yourself.',
    'trackio_static_space_id':
        "'trackio_static_space_id' is TRL's and has no slimgrpo key: slimgrpo never uploads; push the run's final/ "
        'folder yourself.',
    'train_sampling_strategy':
        "'train_sampling_strategy' is TRL's name: in slimgrpo use data.shuffle (random = shuffle, sequential = "
        'dataset order).',
    'transformers_continuous_batching_config':
        "'transformers_continuous_batching_config' is TRL's and has no slimgrpo key: the rollout engine batches "
        'itself.',
    'trust_remote_code':
        "'trust_remote_code' is TRL's name: in slimgrpo use model.trust_remote_code (off by default in both).",
    'use_adaptive_entropy':
        "'use_adaptive_entropy' is TRL's name: in slimgrpo use loss.use_adaptive_entropy (same name and meaning as "
        'TRL).',
    'use_bias_correction_kl':
        "'use_bias_correction_kl' is TRL's name: in slimgrpo use loss.use_bias_correction_kl (same name and meaning "
        'as TRL).',
    'use_bnb_nested_quant':
        "'use_bnb_nested_quant' is TRL's and has no slimgrpo key: nested (double) quantisation is not configurable.",
    'use_cache':
        "'use_cache' is TRL's and has no slimgrpo key: generation always uses a KV cache, training never.",
    'use_cpu':
        "'use_cpu' is TRL's name: in slimgrpo use run.device (true = cpu).",
    'use_dora':
        "'use_dora' is TRL's and has no slimgrpo key: DoRA is not supported.",
    'use_liger_kernel':
        "'use_liger_kernel' is TRL's and has no slimgrpo key: always on in effect: log-probs go through the chunked "
        'LM head, full logits never exist (loss.token_chunk, loss.vocab_chunk).',
    'use_peft':
        "'use_peft' is TRL's name: in slimgrpo use lora.enabled (fp32 adapters that multiply in the model's dtype, as"
        " under TRL's bf16 autocast (peft alone casts each adapter's input to fp32: docs/memory.md)).",
    'use_rslora':
        "'use_rslora' is TRL's and has no slimgrpo key: rank-stabilised LoRA is not supported.",
    'use_transformers_continuous_batching':
        "'use_transformers_continuous_batching' is TRL's and has no slimgrpo key: the rollout engine batches itself.",
    'use_transformers_paged':
        "'use_transformers_paged' is TRL's and has no slimgrpo key: the rollout engine batches itself.",
    'use_vllm':
        "'use_vllm' is TRL's name: in slimgrpo use rollout.engine (true = vllm, colocated in the training process "
        "(TRL's vllm_mode=colocate); false leaves slimgrpo's choice (auto)).",
    'vespo_k_neg':
        "'vespo_k_neg' is TRL's name: in slimgrpo use loss.vespo_k_neg (same name and meaning as TRL).",
    'vespo_k_pos':
        "'vespo_k_pos' is TRL's name: in slimgrpo use loss.vespo_k_pos (same name and meaning as TRL).",
    'vespo_lambda_neg':
        "'vespo_lambda_neg' is TRL's name: in slimgrpo use loss.vespo_lambda_neg (same name and meaning as TRL).",
    'vespo_lambda_pos':
        "'vespo_lambda_pos' is TRL's name: in slimgrpo use loss.vespo_lambda_pos (same name and meaning as TRL).",
    'vllm_enable_sleep_mode':
        "'vllm_enable_sleep_mode' is TRL's name: in slimgrpo use rollout.vllm_sleep_mode (TRL default false, slimgrpo"
        ' true (CUDA only: vLLM has no sleep mode on CPU)).',
    'vllm_gpu_memory_utilization':
        "'vllm_gpu_memory_utilization' is TRL's name: in slimgrpo use rollout.vllm_gpu_memory_utilization (same "
        "default, 0.3; a start-up check only: the KV pool is one step's (rollout.vllm_kv_cache_gb), where TRL's vLLM "
        'fills the fraction).',
    'vllm_group_port':
        "'vllm_group_port' is TRL's and has no slimgrpo key: server mode only: slimgrpo's vLLM runs colocated in the "
        'training process (no server to reach).',
    'vllm_importance_sampling_cap':
        "'vllm_importance_sampling_cap' is TRL's name: in slimgrpo use rollout.importance_sampling_cap (TRL's "
        'deprecated name of vllm_importance_sampling_clip_max (it wins over it, as in TRL)).',
    'vllm_importance_sampling_clip_max':
        "'vllm_importance_sampling_clip_max' is TRL's name: in slimgrpo use rollout.importance_sampling_cap (same "
        'default, 3.0).',
    'vllm_importance_sampling_clip_min':
        "'vllm_importance_sampling_clip_min' is TRL's name: in slimgrpo use rollout.importance_sampling_min (same "
        'default, none).',
    'vllm_importance_sampling_correction':
        "'vllm_importance_sampling_correction' is TRL's name: in slimgrpo use rollout.importance_sampling_correction "
        '(on by default in both).',
    'vllm_importance_sampling_mode':
        "'vllm_importance_sampling_mode' is TRL's name: in slimgrpo use rollout.importance_sampling_mode (the same "
        'four modes, same default (sequence_mask)).',
    'vllm_max_model_length':
        "'vllm_max_model_length' is TRL's and has no slimgrpo key: the engine's context is data.max_prompt_length + "
        'rollout.max_completion_length.',
    'vllm_mode':
        "'vllm_mode' is TRL's name: in slimgrpo use rollout.engine (colocate only (TRL 1.16's default); server is "
        'refused).',
    'vllm_model_impl':
        "'vllm_model_impl' is TRL's and has no slimgrpo key: vLLM's own model implementation is used.",
    'vllm_server_base_url':
        "'vllm_server_base_url' is TRL's and has no slimgrpo key: server mode only: slimgrpo's vLLM runs colocated in"
        ' the training process (no server to reach).',
    'vllm_server_host':
        "'vllm_server_host' is TRL's and has no slimgrpo key: server mode only: slimgrpo's vLLM runs colocated in the"
        ' training process (no server to reach).',
    'vllm_server_port':
        "'vllm_server_port' is TRL's and has no slimgrpo key: server mode only: slimgrpo's vLLM runs colocated in the"
        ' training process (no server to reach).',
    'vllm_server_timeout':
        "'vllm_server_timeout' is TRL's and has no slimgrpo key: server mode only: slimgrpo's vLLM runs colocated in "
        'the training process (no server to reach).',
    'vllm_structured_outputs_regex':
        "'vllm_structured_outputs_regex' is TRL's and has no slimgrpo key: constrained decoding is not supported.",
    'vllm_tensor_parallel_size':
        "'vllm_tensor_parallel_size' is TRL's and has no slimgrpo key: one vLLM engine on the training device (no "
        'tensor parallelism).',
    'warmup_ratio':
        "'warmup_ratio' is TRL's name: in slimgrpo use optim.warmup_ratio (transformers < 5 name; same as "
        'warmup_steps below 1).',
    'warmup_steps':
        "'warmup_steps' is TRL's name: in slimgrpo use optim.warmup_steps (below 1 = a fraction of the steps, as in "
        'transformers).',
    'weight_decay':
        "'weight_decay' is TRL's name: in slimgrpo use optim.weight_decay.",
}
