"""Run length, batch, seed, checkpoints; logging; distributed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class RunConfig:
    output_dir: str = "outputs/run"
    """Run folder: metrics.jsonl, summary.json, checkpoints/, the final model. Relative: from the config file's
    folder when written there, from the working directory when given as an override (like every path key)."""
    max_steps: int = 100
    """Optimizer steps to train (each generates one batch)."""
    num_train_epochs: float | None = None
    """Train for this many passes over the prompts instead: when set, ``max_steps`` becomes
    ceil(epochs x prompts in the dataset / prompts per step) once the data is loaded (TRL's name)."""
    batch_size: int = 64
    """Completions per step across all processes (prompts per step x num_generations); must hold whole groups."""
    seed: int = 42
    """Seed for data order, sampling and initialisation. The same seed on the same machine, thread count and
    library versions gives the same run, bit for bit, across processes and resumes (docs/checkpoints.md)."""
    full_determinism: bool = False
    """TRL's ``full_determinism``: also ``torch.use_deterministic_algorithms(True)`` (deterministic CUDA
    kernels; cuBLAS workspace config, cuDNN without autotuning), for runs that must repeat on a GPU. Slower
    on GPU (some kernels lose their atomics); an op with no deterministic kernel stops the run with torch's
    message naming it. On CPU slimgrpo's runs repeat without it."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda``, ``cuda:1``."""
    num_threads: int | None = None
    """CPU threads for torch (None = torch's default; otherwise >= 1). Recorded with the wait policy in
    threads.json."""
    thread_wait_policy: Literal["auto", "passive", "active"] = "auto"
    """How idle OpenMP threads wait: ``passive`` sleeps (robust when other processes share the cores),
    ``active`` spins (libgomp's default; can be 10x slower on a busy machine); ``auto`` = passive unless
    OMP_WAIT_POLICY / GOMP_SPINCOUNT are set. Applied before torch loads (``slimgrpo train`` re-runs itself)."""
    save_steps: int = 0
    """Write a checkpoint every N steps (0 = only at the end)."""
    save_checkpoints: bool = True
    """Write resumable checkpoints (weights, optimizer, RNG, data position); false = none at all."""
    save_total_limit: int = 2
    """Keep the newest N checkpoints."""
    resume: str = "auto"
    """``auto``: continue from the newest complete checkpoint in output_dir (refused when the config differs
    in keys that cannot change mid-run, see docs/checkpoints.md); ``never``: start afresh; or a checkpoint path."""
    overwrite: bool = False
    """Let a fresh start use a folder that holds an earlier run: that run is moved aside to
    ``<output_dir>.old-<YYYYmmdd-HHMMSS>`` (nothing is deleted). False: such a start is refused."""
    save_model: bool = True
    """Save the trained model (or adapter) in Hugging Face format at the end."""
    max_nonfinite_steps: int = 3
    """Stop (exit code 3) after this many consecutive steps with a NaN/inf loss or gradient (each update is
    skipped); a run whose last update was skipped also ends with exit 3 and no final model."""
    max_collapsed_steps: int = 3
    """Stop (exit code 3, no final model) after this many consecutive steps whose policy looks collapsed
    although every number is finite: the gradient norm vanished or blew up (``collapse_grad_norm_min`` /
    ``_max``), the token entropy is at its ceiling (``collapse_entropy_ratio`` x log(vocabulary size):
    near-uniform sampling) and the mean reward fell to the lowest value of the run. Typical cause: a learning
    rate so high one update wrecked the weights. Each such step logs a warning and writes no checkpoint;
    a run that ends inside such a streak also exits 3. 0 = only warn."""
    collapse_entropy_ratio: float = 0.95
    """Token entropy at or above this fraction of log(vocabulary size) counts as at its ceiling (see
    ``max_collapsed_steps``)."""
    collapse_grad_norm_min: float = 1e-8
    """A gradient norm at or below this counts as vanished (see ``max_collapsed_steps``)."""
    collapse_grad_norm_max: float = 1e4
    """A gradient norm (before clipping) at or above this counts as blown up (see ``max_collapsed_steps``)."""
    stall_steps: int = 10
    """Say once, on the terminal, in metrics.jsonl (``stall/*``) and in the report, when learning has stalled
    for this many consecutive steps: at least ``stall_zero_std_fraction`` of the groups had rewards all equal
    (``frac_reward_zero_std``: no gradient from them), or the token entropy stayed below
    ``stall_entropy_ratio`` x its value at the start while the mean reward was flat (``stall_reward_flat``).
    The message names the likely cause (a reward saturated or never paid, a learning rate too high, a
    temperature too low). 0 = never check."""
    stall_zero_std_fraction: float = 0.75
    """A step carries (almost) no learning signal when at least this fraction of its groups had rewards all
    equal (see ``stall_steps``)."""
    stall_entropy_ratio: float = 0.2
    """Token entropy below this fraction of its value at the start of the run (the mean of the first three
    steps) counts as collapsed (see ``stall_steps``)."""
    stall_reward_flat: float = 0.1
    """The mean reward counts as flat when, over the stretch, it moved (highest - lowest step mean) by at most
    this fraction of the reward's spread at the start (the mean ``reward_std`` of the first three steps)."""
    stop_on_stall: bool = False
    """Stop the run where a stall is detected (see ``stall_steps``) with exit code 5, without a final model
    (with ``keep_best``: ``final/`` is the best model so far, ``last/`` the stop step's); the last checkpoint
    from before the stalled stretch is kept (pruning by ``save_total_limit`` spares it while a stretch lasts).
    False: warn and train on."""
    keep_best: bool = False
    """TRL's ``load_best_model_at_end``: ``final/`` is the model of the evaluation with the best
    ``run.best_metric`` (before training counts too: a run that only got worse returns the model it started
    from), and the last step's model goes beside it to ``last/``. Each new best is saved as a checkpoint that
    pruning by ``save_total_limit`` never deletes; summary.json, the report and the terminal name its step and
    value. Needs a metric (``eval.data``, or ``best_metric`` naming a training reward) and checkpoints.
    False: ``final/`` is the last step's model."""
    best_metric: str = ""
    """TRL's ``metric_for_best_model``: what "best" means for ``keep_best`` and ``early_stopping_patience``.
    A held-out metric of ``eval.*`` (``eval/accuracy_greedy``, ``eval/accuracy_sampled``, ``eval/pass@<k>``,
    ``eval/mean_reward``, ``eval/rewards/<function>``), judged at every evaluation; or a training reward
    (``reward``, ``rewards/<function>/mean``), judged every ``save_steps`` steps on its mean since the last
    judgement. Empty: ``eval/accuracy_greedy`` when ``eval.data`` is set. Without ``keep_best`` it judges nothing
    (accepted, as TRL accepts ``metric_for_best_model`` alone)."""
    greater_is_better: bool = True
    """TRL's ``greater_is_better``: a higher ``best_metric`` is better (every metric slimgrpo names is)."""
    early_stopping_patience: int | None = None
    """Stop the run after this many judgements of ``best_metric`` in a row without an improvement of more
    than ``early_stopping_threshold`` (TRL: ``EarlyStoppingCallback(early_stopping_patience)``); ``final/``
    is the best model, exit code 0, summary.json ``stopped_by: early_stopping``. Needs ``keep_best``.
    None: never stop early."""
    early_stopping_threshold: float = 0.0
    """How much better than the best so far a judgement must be to reset the patience (TRL's
    ``early_stopping_threshold``). The best model follows any improvement, as in TRL."""


@dataclass
class LogConfig:
    report_to: list[str] | str = "none"
    """Extra metric sinks on top of metrics.jsonl: tensorboard, wandb, trackio, mlflow, none."""
    logging_steps: int = 1
    """Print a metrics line every N steps."""
    log_completions_steps: int = 10
    """Append sample completions (prompt, completion, rewards, advantage) every N steps (0 = never)."""
    num_completions_to_log: int = 4
    """How many completions each time."""
    progress: bool = True
    """Show a progress bar with ETA (false: plain metric lines only, every ``logging_steps``)."""
    verbose: bool = False
    """Show third-party warnings, info logs and progress bars (transformers, torch, peft) in the terminal;
    off = only slimgrpo's own messages and errors."""


@dataclass
class DistributedConfig:
    strategy: Literal["ddp", "fsdp"] = "ddp"
    """How the ranks of ``torchrun --nproc_per_node N`` share the model (ignored in a single process).
    ``ddp``: every rank holds the whole model and gradients are all-reduced (models that fit one device;
    QLoRA). ``fsdp``: FSDP2 ``fully_shard`` splits weights, gradients and optimizer state over the ranks
    (models that do not fit one device, full fine-tuning or LoRA; not with ``model.load_in_4bit``); see
    ``fsdp_generation`` for sampling."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Collective backend: ``auto`` = nccl when CUDA is available, gloo on CPU."""
    timeout_s: float = 1800.0
    """Longest a collective may wait for the other ranks before the job fails with a timeout error (a rank
    that hangs or died). Must exceed the longest gap between ranks, e.g. one slow rollout plus rewards."""
    fsdp_generation: Literal["gather", "per_layer"] = "gather"
    """``fsdp`` only: how sampling reads sharded weights. ``gather``: all-gather the whole model once per
    step and free it after the rollout (extra memory: one full copy of the weights). ``per_layer``: every
    layer gathers its weights for each forward and frees them (extra memory ~ one layer plus embeddings
    and LM head; one all-gather per layer per generated token, so much slower)."""
