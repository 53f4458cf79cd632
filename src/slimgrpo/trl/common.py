"""What TRL's trainers have in common that scripts call: the callbacks, the hub methods (refused: slimgrpo never
uploads), ``ref_model`` and ``accelerator``. ``GRPOTrainer`` and ``PPOTrainer`` take them from ``TrlTrainer``; each
sets ``args``, ``callback_handler`` and ``_loop`` (the run's ``TrainLoop``) when it is made."""

from __future__ import annotations

from typing import Any

NO_HUB = ("slimgrpo never uploads (no model or dataset hub at run time): push the folder save_model wrote "
          "yourself, e.g. `huggingface-cli upload REPO {folder}`")


class TrlTrainer:
    """The methods and attributes both TRL trainer classes share (module docstring)."""

    args: Any
    callback_handler: Any
    _loop: Any

    def add_callback(self, callback) -> None:
        self.callback_handler.add_callback(callback)

    def remove_callback(self, callback) -> None:
        self.callback_handler.remove_callback(callback)

    def pop_callback(self, callback):
        return self.callback_handler.pop_callback(callback)

    def push_to_hub(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__}.push_to_hub: " + NO_HUB.format(folder=self.args.output_dir))

    def create_model_card(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__}.create_model_card: slimgrpo writes no model card (no hub)")

    @property
    def ref_model(self):
        """The reference policy's copy (full fine-tuning with a KL term), else None (LoRA: the base with the
        adapters off, no copy), as TRL's attribute reads."""
        return self._loop.policy.reference_cpu

    @property
    def accelerator(self):
        raise AttributeError(f"{type(self).__name__}.accelerator: slimgrpo runs without Accelerate (torchrun for "
                             "several processes)")
