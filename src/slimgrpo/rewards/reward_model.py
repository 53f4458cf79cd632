"""A sequence-classification model as a reward function, as TRL's GRPOTrainer takes one in ``reward_funcs``.

TRL 1.16 accepts a model folder (loaded with ``AutoModelForSequenceClassification.from_pretrained(path,
num_labels=1)``) or a model object, and scores each completion with the model's first logit on the prompt
and completion together:

* conversational prompts: the chat template rendered over ``prompt + completion`` messages;
* plain text: ``prompt + completion`` as one string;

tokenized with right padding and no added special tokens, under ``inference_mode``. The reward's name in
the metrics is the basename of the model's name/path (``rewards/<name>/mean``), as in TRL.
"""

from __future__ import annotations

import os
from typing import Any

import torch

__all__ = ["RewardModel", "is_model_folder"]

DEFAULT_BATCH_ROWS = 32


def is_model_folder(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))


def _device(spec: str | torch.device | None) -> torch.device:
    if spec is None or str(spec) == "auto":  # under torchrun, this process's GPU (as the policy's)
        rank = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device(f"cuda:{rank}" if torch.cuda.is_available() else "cpu")
    return torch.device(spec)


class RewardModel:
    """Callable with TRL's reward signature: ``rm(prompts, completions, **kwargs) -> list[float]``.

    Args:
        model: a folder path, or a ``PreTrainedModel`` for sequence classification (``num_labels=1``).
        tokenizer: its tokenizer; loaded from the folder (or the model's ``name_or_path``) when None.
        device: where the model runs (``auto`` = CUDA when available); it is moved there once.
        batch_rows: completions scored per forward pass.
        trust_remote_code: passed to ``from_pretrained`` (off by default).
    """

    def __init__(self, model: Any, tokenizer: Any = None, device: str | torch.device | None = "auto",
                 batch_rows: int = DEFAULT_BATCH_ROWS, trust_remote_code: bool = False):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = _device(device)
        if isinstance(model, (str, os.PathLike)):
            path = str(model)
            if not is_model_folder(path):
                raise FileNotFoundError(f"reward model {path!r}: not a model folder (no config.json)")
            dtype = "auto" if self.device.type == "cuda" else torch.float32
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, dtype=dtype, trust_remote_code=trust_remote_code)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        name_or_path = getattr(model.config, "_name_or_path", "") or getattr(model.config, "name_or_path", "")
        if tokenizer is None:
            if not name_or_path:
                raise ValueError("RewardModel: a model object without a name_or_path needs its tokenizer: "
                                 "RewardModel(model, tokenizer)")
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        # The model reads its score at the last non-pad token, so it must know the pad id.
        text_config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        text_config.pad_token_id = tokenizer.pad_token_id
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.batch_rows = batch_rows
        self.__name__ = str(name_or_path).rstrip("/").split("/")[-1] or type(model).__name__

    def texts(self, prompts: list, completions: list) -> list[str]:
        """What the model reads for each row (see the module docs)."""
        out = []
        for prompt, completion in zip(prompts, completions, strict=True):
            if isinstance(prompt, str):
                out.append(prompt + (completion if isinstance(completion, str) else completion[-1]["content"]))
            else:
                out.append(self.tokenizer.apply_chat_template(list(prompt) + list(completion), tokenize=False))
        return out

    def __call__(self, prompts: list, completions: list, **kwargs) -> list[float]:
        texts = self.texts(list(prompts), list(completions))
        scores: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_rows):
                batch = self.tokenizer(texts[start:start + self.batch_rows], return_tensors="pt", padding=True,
                                       padding_side="right", add_special_tokens=False).to(self.device)
                scores += self.model(**batch).logits[:, 0].float().cpu().tolist()
        return scores
