"""Why each test of TRL's tests/test_grpo_trainer.py that passes against TRL fails with slimgrpo.trl's classes:
``{test id (class::name[params]): (class, reason)}``, read by ``compare.py`` (which prints any failure missing
here, and any entry whose test passed). Classes:

* ``difference``: slimgrpo differs on purpose (docs/trl-migration.md says how);
* ``internal``: the test reads or patches TRL's private members or transformers ``Trainer`` internals that a
  script does not call;
* ``open``: behaviour a script could rely on that slimgrpo.trl does not have yet.
"""

CLASSES = {"difference": "(b) deliberate difference", "internal": "(c) TRL internals", "open": "(a) not fixed yet"}

FAILURES: dict[str, tuple[str, str]] = {
    'TestGRPORolloutDispatch::test_generate_rollout_func_raises_when_required_keys_are_missing': (
        'internal',
        "builds the trainer with object.__new__, assigns trainer.accelerator (slimgrpo's is a read-only "
        "property: no Accelerate) and calls TRL's private _generate"),
    'TestGRPOTrainer::test_evaluate_with_eval_dataset[dataset]': (
        'difference',
        "reads eval_loss / eval_<name>_loss: slimgrpo's evaluation has no loss (accuracy, pass@k, mean and "
        'per-function rewards instead; docs/trl-migration.md). The named and streamed sets and '
        "evaluate(eval_dataset=...) it uses pass slimgrpo's own tests"),
    'TestGRPOTrainer::test_evaluate_with_eval_dataset[iterable_dataset]': (
        'difference',
        "reads eval_loss / eval_<name>_loss: slimgrpo's evaluation has no loss (accuracy, pass@k, mean and "
        'per-function rewards instead; docs/trl-migration.md). The named and streamed sets and '
        "evaluate(eval_dataset=...) it uses pass slimgrpo's own tests"),
    'TestGRPOTrainer::test_evaluate_with_eval_dataset[dataset_dict]': (
        'difference',
        "reads eval_loss / eval_<name>_loss: slimgrpo's evaluation has no loss (accuracy, pass@k, mean and "
        'per-function rewards instead; docs/trl-migration.md). The named and streamed sets and '
        "evaluate(eval_dataset=...) it uses pass slimgrpo's own tests"),
    'TestGRPOTrainer::test_evaluate_with_eval_dataset[iterable_dataset_dict]': (
        'difference',
        "reads eval_loss / eval_<name>_loss: slimgrpo's evaluation has no loss (accuracy, pass@k, mean and "
        'per-function rewards instead; docs/trl-migration.md). The named and streamed sets and '
        "evaluate(eval_dataset=...) it uses pass slimgrpo's own tests"),
    'TestGRPOTrainer::test_evaluate_with_eval_dataset[dict_of_dataset]': (
        'difference',
        "reads eval_loss / eval_<name>_loss: slimgrpo's evaluation has no loss (accuracy, pass@k, mean and "
        'per-function rewards instead; docs/trl-migration.md). The named and streamed sets and '
        "evaluate(eval_dataset=...) it uses pass slimgrpo's own tests"),
    'TestGRPOTrainer::test_evaluate_with_eval_dataset[dict_of_iterable_dataset]': (
        'difference',
        "reads eval_loss / eval_<name>_loss: slimgrpo's evaluation has no loss (accuracy, pass@k, mean and "
        'per-function rewards instead; docs/trl-migration.md). The named and streamed sets and '
        "evaluate(eval_dataset=...) it uses pass slimgrpo's own tests"),
    'TestGRPOTrainer::test_iterable_dataset_requires_dispatch_batches_false': (
        'difference',
        "accelerator_config is refused at GRPOConfig(...) (no Accelerate), with slimgrpo's message rather "
        "than the trainer's"),
    'TestGRPOTrainer::test_iterable_dataset_forces_num_workers_zero': (
        'internal',
        'asserts TRL rewrites args.dataloader_num_workers to 0; slimgrpo has no DataLoader workers (the key '
        "is ignored) and leaves the script's args as given"),
    'TestGRPOTrainer::test_iterable_eval_keeps_map_style_train_workers': (
        'internal',
        'calls get_train_dataloader / get_eval_dataloader, transformers Trainer internals slimgrpo does not '
        'have'),
    'TestGRPOTrainer::test_train_with_iterable_dataset': (
        'internal',
        "asserts args.accelerator_config.dispatch_batches is False (Accelerate's setting TRL rewrites); the "
        'streamed training itself runs (tests/trl_scripts/test_grpo_trl_behaviour.py::test_streamed_datasets)'),
    'TestGRPOTrainer::test_train_loss_types[cispo-False]': (
        'difference',
        "loss_type='cispo' without epsilon_high is refused: TRL would cap the ratio at epsilon=0.2 "
        '(docs/loss.md)'),
    'TestGRPOTrainer::test_warning_raised_sequence_level_with_token_summed_loss[cispo]': (
        'difference',
        'the same cispo refusal, before the warning the test looks for'),
    'TestGRPOTrainer::test_train_with_generation_kwargs': (
        'difference',
        "generation_kwargs is refused (num_beams, length_penalty: slimgrpo's engine samples; temperature, "
        'top_p, top_k, min_p, repetition_penalty have their own keys)'),
    'TestGRPOTrainer::test_train_reward_func_with_log_extra': (
        'internal',
        "reads trainer._logs, TRL's private buffer of logged completions (slimgrpo writes them to "
        'completions.jsonl)'),
    'TestGRPOTrainer::test_prepare_input_called_with_correct_data': (
        'internal',
        "patches the trainer's training_step / _prepare_inputs, transformers Trainer internals"),
    'TestGRPOTrainer::test_train_with_mask_truncated_completions': (
        'internal',
        "mocks transformers' generate(), which slimgrpo's engine never calls; with real sampling from random "
        "weights every completion is truncated and masked (the test's own comment), so no weight moves"),
    'TestGRPOTrainer::test_warning_raised_all_rewards_none': (
        'difference',
        "looks for the warning on TRL's module logger (trl.trainer.grpo_trainer); slimgrpo counts such rows "
        "as reward_faults/total/all_nan in the step's metrics and warns per function on its own logger"),
    'TestGRPOTrainer::test_train_with_multiple_environments': (
        'internal',
        "reads trainer._env_tools, TRL's private table of each environment's tools, and patches "
        "trainer.model.generate to script the completions (tool calls, their arguments); slimgrpo's engine "
        'never calls generate, so the scripted calls are not made and the asserted counts differ. Tool '
        "calling and environments run in slimgrpo's own tests (tests/agent, tests/trl_scripts)"),
    'TestGRPOTrainerVLM::test_train_vlm[trl-internal-testing/tiny-Gemma3ForConditionalGeneration]': (
        'difference',
        'vision-language models are not trained: slimgrpo loads text models (AutoModelForCausalLM), text only'),
    'TestGRPOTrainerVLM::test_train_vlm[trl-internal-testing/tiny-LlavaNextForConditionalGeneration]': (
        'difference',
        'vision-language models are not trained: slimgrpo loads text models (AutoModelForCausalLM), text only'),
    'TestGRPOTrainerVLM::test_train_vlm_with_pad_to_multiple_of': (
        'difference',
        'vision-language models are not trained: slimgrpo loads text models (AutoModelForCausalLM), text only'),
    'TestGRPOTrainerVLM::test_train_vlm_log_multimodal_false': (
        'difference',
        'vision-language models are not trained: slimgrpo loads text models (AutoModelForCausalLM), text only'),
    'TestGRPOTrainer::test_train_with_tools[tools0]': (
        'internal',
        "patches trainer.model.generate to script the completions (tool calls, their arguments); slimgrpo's "
        'engine never calls generate, so the scripted calls are not made and the asserted counts differ. Tool '
        "calling and environments run in slimgrpo's own tests (tests/agent, tests/trl_scripts)"),
    'TestGRPOTrainer::test_train_with_tools[tools1]': (
        'internal',
        "patches trainer.model.generate to script the completions (tool calls, their arguments); slimgrpo's "
        'engine never calls generate, so the scripted calls are not made and the asserted counts differ. Tool '
        "calling and environments run in slimgrpo's own tests (tests/agent, tests/trl_scripts)"),
    'TestGRPOTrainer::test_train_with_environment_factory': (
        'internal',
        "patches trainer.model.generate to script the completions (tool calls, their arguments); slimgrpo's "
        'engine never calls generate, so the scripted calls are not made and the asserted counts differ. Tool '
        "calling and environments run in slimgrpo's own tests (tests/agent, tests/trl_scripts)"),
    'TestGRPOTrainer::test_train_with_environment_owned_reward': (
        'internal',
        "patches trainer.model.generate to script the completions (tool calls, their arguments); slimgrpo's "
        'engine never calls generate, so the scripted calls are not made and the asserted counts differ. Tool '
        "calling and environments run in slimgrpo's own tests (tests/agent, tests/trl_scripts)"),
}
