"""A reward function written for TRL's GRPOTrainer, used unchanged by examples/trl_grpo.yaml.

TRL 1.16 passes ``trainer_state``, ``log_metric`` and ``log_extra`` besides the prompts, completions and
dataset columns (here ``answer``); slimgrpo does the same.
"""


def exact_answer(prompts, completions, answer, trainer_state=None, log_metric=None, log_extra=None, **kwargs):
    texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    scores = [1.0 if t.strip() == str(a).strip() else 0.0 for t, a in zip(texts, answer)]
    if log_metric is not None:
        log_metric("exact_answer/solved", sum(scores) / len(scores))
    if log_extra is not None:
        log_extra("gold", list(answer))
    return scores
