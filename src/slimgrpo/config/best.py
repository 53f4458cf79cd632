"""Which metric judges "the best model" (``run.keep_best``) and "getting worse" (``run.early_stopping_patience``),
and the checks that refuse a config that cannot judge, before any weights load."""

from __future__ import annotations

from slimgrpo.config.errors import ConfigError

EVAL_DEFAULT = "eval/accuracy_greedy"


def reward_function_names(cfg) -> tuple[list[str], bool]:
    """The display names ``rewards/loading.py`` gives ``rewards.functions`` (a built-in's name, the part after
    ``:``, a callable's ``__name__``), and whether every one is known without loading anything (a reward
    model folder is named only once loaded)."""
    names, known = [], True
    for spec in cfg.rewards.functions:
        if callable(spec) and not (hasattr(spec, "config") and hasattr(spec, "forward")):
            names.append(getattr(spec, "__name__", type(spec).__name__))
        elif isinstance(spec, str) and ":" in spec:
            names.append(spec.rsplit(":", 1)[1].strip())
        elif isinstance(spec, str) and "/" not in spec and "\\" not in spec:
            names.append(spec.strip())
        else:
            known = False
    return names, known


def available_metrics(cfg) -> list[str]:
    """Every name ``run.best_metric`` may take with this config: the held-out metrics the evaluation writes
    (when ``eval.data`` is set) and the training rewards."""
    fns, _ = reward_function_names(cfg)
    out = []
    if cfg.eval.data:
        out += ["eval/accuracy_greedy", "eval/accuracy_sampled"]
        if cfg.eval.num_samples > 1:
            out.append(f"eval/pass@{cfg.eval.num_samples}")
        out += ["eval/mean_reward", *(f"eval/rewards/{fn}" for fn in fns)]
    return out + ["reward", *(f"rewards/{fn}/mean" for fn in fns)]


def best_metric(cfg) -> str:
    """``run.best_metric``, or its default (``eval/accuracy_greedy`` with ``eval.data``; else empty)."""
    return cfg.run.best_metric or (EVAL_DEFAULT if cfg.eval.data else "")


def is_eval_metric(name: str) -> bool:
    return name.startswith("eval/")


def _known(cfg, name: str) -> bool:
    if name in available_metrics(cfg):
        return True
    _, all_known = reward_function_names(cfg)  # a reward model's name is only known once it loads
    if all_known:
        return False
    return (bool(cfg.eval.data) and name.startswith("eval/rewards/")) or (
        name.startswith("rewards/") and name.endswith("/mean"))


def validate_best(cfg) -> None:
    """``run.keep_best`` / ``run.best_metric`` / ``run.early_stopping_*``: refused when nothing can judge."""
    run = cfg.run
    patience = run.early_stopping_patience
    if patience is not None and patience <= 0:
        raise ConfigError(f"run.early_stopping_patience must be >= 1 (evaluations in a row without improvement "
                          f"before the run stops) or null (never stop early), got {patience}")
    if run.early_stopping_threshold < 0:
        raise ConfigError(f"run.early_stopping_threshold must be >= 0, got {run.early_stopping_threshold}")
    if patience is not None and not run.keep_best:
        raise ConfigError("run.early_stopping_patience stops the run and keeps the best model: set "
                          "run.keep_best=true too (as TRL's EarlyStoppingCallback needs load_best_model_at_end)")
    if not run.keep_best:  # run.best_metric alone judges nothing (TRL: metric_for_best_model without
        return             # load_best_model_at_end): a recipe's judge may stay set with keep_best switched off
    metric = best_metric(cfg)
    choices = ", ".join(available_metrics(cfg))
    if not metric:
        raise ConfigError(f"run.keep_best=true has no metric to judge the best model by: set eval.data (held-out "
                          f"prompts; run.best_metric then defaults to {EVAL_DEFAULT}) or run.best_metric to a "
                          f"training reward ({choices}, judged every run.save_steps steps)")
    if not _known(cfg, metric):
        why = (" (eval.data is empty: no held-out metric is produced)" if is_eval_metric(metric) and not cfg.eval.data
               else "")
        raise ConfigError(f"run.best_metric={metric!r} is not a metric this run produces{why}: choose one of "
                          f"{choices}")
    if not run.save_checkpoints:
        raise ConfigError("run.keep_best=true keeps the best model as a checkpoint: set run.save_checkpoints=true")
    if not is_eval_metric(metric) and run.save_steps <= 0:
        raise ConfigError(f"run.best_metric={metric!r} is a training metric, judged at each checkpoint on its mean "
                          "since the last one: set run.save_steps (e.g. run.save_steps=10), or judge by a held-out "
                          "metric with eval.data")
