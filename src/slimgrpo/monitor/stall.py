"""Has the run stopped learning? A detector over each step's numbers (no model), and the first step's check
that every reward function tells completions apart.

GRPO learns from the differences between the completions of a group: a group whose rewards are all equal
has advantage 0 on every completion and gives no gradient. Two signs, held for ``run.stall_steps``
consecutive steps, make a **stall**:

- *no signal*: at least ``run.stall_zero_std_fraction`` of the groups had rewards all equal
  (``frac_reward_zero_std``, TRL's metric);
- *entropy collapse*: the token entropy stayed below ``run.stall_entropy_ratio`` x its start (the mean of
  the first three steps) while the mean reward was flat (it moved by at most ``run.stall_reward_flat`` x the
  reward's spread at the start, the mean ``reward_std`` of the first three steps);
- *slide*: the entropy stayed that low while the run got worse: the mean reward of the stretch's second half
  fell below its first half's by more than that tolerance, or the held-out metric (``eval/accuracy_greedy``,
  else ``eval/mean_reward``) fell between the first and the last evaluation of the stretch. A policy that
  learned, then turned near-deterministic and lost what it learned (``run.keep_best`` keeps the model from
  before; ``run.early_stopping_patience`` stops such a run).

The detector says so once per stretch, with the numbers and the likely cause (a reward saturated or never
paid, a learning rate too high, a temperature too low). Its fields go into the step's record of
metrics.jsonl: ``stall/start_step`` and ``stall/steps`` on every step from the detection to the end of the
stretch, and on the detecting step ``stall/detected`` (1), ``stall/kind`` and ``stall/reason``.

The last checkpoint from before a stretch that starts at step s is the newest with step <= s - 1 (the state
in which the stretch's first step began); checkpoint pruning spares it while the stretch, or a candidate for
one, goes on (:meth:`StallDetector.protected_step`), so it survives any ``run.save_total_limit``.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

NO_SIGNAL, ENTROPY_COLLAPSE, SLIDE = "no_signal", "entropy_collapse", "slide"
HELDOUT_KEYS = ("eval/accuracy_greedy", "eval/mean_reward")  # the held-out metric a slide reads, first found
START_STEPS = 3  # the steps whose entropy and reward spread are "the start"


@dataclass(frozen=True)
class StallLimits:
    steps: int = 10  # 0 = never check
    zero_std_fraction: float = 0.75
    entropy_ratio: float = 0.2
    reward_flat: float = 0.1
    stop: bool = False
    learning_rate: float = 1e-6  # named in the likely cause
    temperature: float = 1.0
    grouped: bool = True  # advantages from the group (GRPO family); False: PPO's critic (no "no signal" sign)


@dataclass(frozen=True)
class StepNumbers:
    """What the detector reads from one step's metrics (None where the step has no such number)."""

    step: int
    reward: float | None
    reward_std: float | None
    zero_std: float | None  # frac_reward_zero_std
    entropy: float | None
    means: dict[str, float]  # rewards/<fn>/mean
    stds: dict[str, float]  # rewards/<fn>/std
    zero_std_by_fn: dict[str, float]  # rewards/<fn>/frac_zero_std
    heldout: float | None = None  # eval/accuracy_greedy (else eval/mean_reward) on a step that evaluated

    @classmethod
    def from_metrics(cls, step: int, metrics: dict[str, Any]) -> "StepNumbers":
        def per_fn(suffix: str) -> dict[str, float]:
            out = {}
            for key in metrics:
                if key.startswith("rewards/") and key.endswith(suffix):
                    v = _number(metrics, key)
                    if v is not None:
                        out[key[len("rewards/"):-len(suffix)]] = v
            return out

        heldout = next((v for v in (_number(metrics, k) for k in HELDOUT_KEYS) if v is not None), None)
        return cls(step, _number(metrics, "reward"), _number(metrics, "reward_std"),
                   _number(metrics, "frac_reward_zero_std"), _number(metrics, "entropy"),
                   per_fn("/mean"), per_fn("/std"), per_fn("/frac_zero_std"), heldout)


@dataclass
class Stall:
    """One stalled stretch: steps ``start_step`` .. ``end_step``, reported at ``detected_step``."""

    kind: str
    start_step: int
    detected_step: int
    end_step: int
    message: str

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StallVerdict:
    """What one step adds: fields for its metrics record, warnings to print, a newly detected stall."""

    fields: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    detected: Stall | None = None


def _number(metrics: dict[str, Any], key: str) -> float | None:
    v = metrics.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


# ----------------------------------------------------------------------------- step 1: rewards without spread


def no_spread_warnings(n: StepNumbers, grouped: bool = True) -> list[str]:
    """One warning per reward function that had no spread in any group of this step (its completions all
    scored alike within every group): it gives GRPO nothing to learn from. PPO (``grouped=False``), whose
    critic compares completions across groups too: only a function that scored every completion alike."""
    if grouped:
        flat = [fn for fn, z in n.zero_std_by_fn.items() if z >= 1.0 - 1e-9 and fn in n.means]
    else:
        flat = [fn for fn, std in n.stds.items() if std <= 1e-9 and fn in n.means]
    algorithm = "GRPO" if grouped else "PPO"
    varying = [fn for fn in (n.zero_std_by_fn if grouped else n.stds) if fn not in flat]
    out = []
    for fn in flat:
        alike = (f"every completion scored {n.means[fn]:.4g}" if n.stds.get(fn, 1.0) <= 1e-9 else
                 f"the completions of each group scored alike (mean {n.means[fn]:.4g})")
        head = f"reward {fn}: no spread: {algorithm} cannot learn from it. At step {n.step} {alike}"
        if not varying:
            others = " (nor from any other reward function)" if len(flat) > 1 else ""
            nothing = "every advantage is 0" if grouped else "the critic learns a constant"
            out.append(f"{head}, so {nothing} and the update has no reward signal{others}. Check that the "
                       "function tells completions apart (does it read the right column? does it return the same "
                       "value whatever the completion?), or that the task is neither solved nor failed by every "
                       "completion.")
        else:
            out.append(f"{head}: it adds the same to every completion{' of a group' if grouped else ''}, so only "
                       f"{', '.join(varying)} {'drives' if len(varying) == 1 else 'drive'} the update. Check whether "
                       f"{fn} is always satisfied (or never) from the start, or constant by mistake.")
    return out


# ----------------------------------------------------------------------------- the detector


@dataclass
class StallDetector:
    """Feed each step's metrics to :meth:`observe`, in step order."""

    limits: StallLimits
    stalls: list[Stall] = field(default_factory=list)  # every stretch detected, the last one maybe still going
    active: Stall | None = None  # the detected stretch that is still going
    no_signal_since: int | None = None  # first step of the current run of no-signal steps
    low_entropy_since: int | None = None
    _start_entropy: list[float] = field(default_factory=list)
    _start_spread: list[float] = field(default_factory=list)
    _ranges: dict[str, tuple[float, float]] = field(default_factory=dict)  # fn -> (lowest, highest) mean so far
    _recent: deque = field(default_factory=deque)

    @property
    def start_entropy(self) -> float | None:
        return _mean(self._start_entropy)

    @property
    def start_spread(self) -> float | None:
        return _mean(self._start_spread)

    def observe(self, step: int, metrics: dict[str, Any]) -> StallVerdict:
        verdict = StallVerdict()
        n = StepNumbers.from_metrics(step, metrics)
        if step == 1:  # bad input: a reward that cannot teach anything from the start
            verdict.warnings = no_spread_warnings(n, self.limits.grouped)
        if metrics.get("update_skipped") or self.limits.steps <= 0:
            return verdict  # a skipped step is the non-finite guard's business
        if len(self._start_entropy) < START_STEPS and n.entropy is not None:
            self._start_entropy.append(n.entropy)
        if len(self._start_spread) < START_STEPS and n.reward_std is not None:
            self._start_spread.append(n.reward_std)
        no_signal = (self.limits.grouped and n.zero_std is not None
                     and n.zero_std >= self.limits.zero_std_fraction)
        e0 = self.start_entropy
        low_entropy = e0 is not None and n.entropy is not None and n.entropy < self.limits.entropy_ratio * e0
        self.no_signal_since = (self.no_signal_since or step) if no_signal else None
        self.low_entropy_since = (self.low_entropy_since or step) if low_entropy else None
        self._recent.append(n)
        while len(self._recent) > self.limits.steps:
            self._recent.popleft()
        for fn, v in n.means.items():
            lo, hi = self._ranges.get(fn, (v, v))
            self._ranges[fn] = (min(lo, v), max(hi, v))
        if self.active is not None:
            if no_signal or low_entropy:
                self.active.end_step = step
            else:
                self.active = None  # the stretch ended with the step before
        elif (found := self._detect(step)) is not None:
            self.active = verdict.detected = found
            self.stalls.append(found)
        if self.active is not None:
            verdict.fields = {"stall/start_step": self.active.start_step,
                              "stall/steps": step - self.active.start_step + 1}
        if verdict.detected is not None:
            verdict.fields.update({"stall/detected": 1, "stall/kind": verdict.detected.kind,
                                   "stall/reason": verdict.detected.message})
        return verdict

    def _detect(self, step: int) -> Stall | None:
        need = self.limits.steps
        window = list(self._recent)
        if self.no_signal_since is not None and step - self.no_signal_since + 1 >= need:
            start = self.no_signal_since
            return Stall(NO_SIGNAL, start, step, step, self.describe(NO_SIGNAL, start, step, window))
        if (self.low_entropy_since is not None and step - self.low_entropy_since + 1 >= need
                and self.reward_flat(window)):
            start = max(self.low_entropy_since, step - need + 1)
            return Stall(ENTROPY_COLLAPSE, start, step, step, self.describe(ENTROPY_COLLAPSE, start, step, window))
        if (self.low_entropy_since is not None and step - self.low_entropy_since + 1 >= need
                and self.sliding(window)):
            start = max(self.low_entropy_since, step - need + 1)
            return Stall(SLIDE, start, step, step, self.describe(SLIDE, start, step, window))
        return None

    def sliding(self, window: list[StepNumbers]) -> bool:
        """The run got worse over the stretch: the mean reward of its second half below its first half's by more
        than ``reward_flat`` x the reward's spread at the start, or the held-out metric lower at the stretch's
        last evaluation than at its first."""
        tol = self.limits.reward_flat * (self.start_spread or 0.0) + 1e-9
        rewards = [n.reward for n in window if n.reward is not None]
        half = len(rewards) // 2
        if half and _mean(rewards[:half]) - _mean(rewards[-half:]) > tol:
            return True
        heldout = [n.heldout for n in window if n.heldout is not None]
        return len(heldout) >= 2 and heldout[-1] < heldout[0] - 1e-9

    def reward_flat(self, window: list[StepNumbers]) -> bool:
        """The mean reward moved by at most ``reward_flat`` x the reward's spread at the start."""
        rewards = [n.reward for n in window if n.reward is not None]
        if len(rewards) < len(window) or not rewards:
            return False
        spread = self.start_spread or 0.0
        return max(rewards) - min(rewards) <= self.limits.reward_flat * spread + 1e-9

    # ------------------------------------------------------------------------- the message

    def describe(self, kind: str, start: int, step: int, window: list[StepNumbers]) -> str:
        last = window[-1]
        rewards = [n.reward for n in window if n.reward is not None]
        reward = (f"mean reward {rewards[-1]:.4g} (it moved {max(rewards) - min(rewards):.2g} over the stretch)"
                  if rewards else "no mean reward")
        e0 = self.start_entropy
        entropy = (f"token entropy {last.entropy:.3g}" + (f" ({last.entropy / e0:.0%} of its start, {e0:.3g})"
                                                          if e0 else "")) if last.entropy is not None else ""
        fns = ", ".join(f"{fn} {v:.4g}" for fn, v in last.means.items())
        if kind == SLIDE:
            half = max(1, len(window) // 2)
            first = _mean([n.reward for n in window[:half] if n.reward is not None])
            second = _mean([n.reward for n in window[-half:] if n.reward is not None])
            heldout = [n.heldout for n in window if n.heldout is not None]
            fell = (f"the mean reward fell from {first:.4g} to {second:.4g} (first and second half of the stretch)"
                    if first is not None and second is not None and second < first else "")
            if len(heldout) >= 2:
                fell += (" and " if fell else "") + f"the held-out metric went {heldout[0]:.4g} -> {heldout[-1]:.4g}"
            return (f"step {step}: the run is sliding since step {start}: for {step - start + 1} steps the token "
                    f"entropy stayed below {self.limits.entropy_ratio:.0%} of its start while {fell} ({reward}; "
                    f"{entropy}). Likely cause: {self.likely_cause(kind, window)}. run.keep_best=true keeps the "
                    "model from before the slide; run.early_stopping_patience stops such a run.")
        if kind == NO_SIGNAL:
            zs = [n.zero_std for n in window if n.zero_std is not None]
            what = (f"for {step - start + 1} steps, {_mean(zs):.0%} of the groups (mean over the stretch; "
                    f"frac_reward_zero_std >= {self.limits.zero_std_fraction:g}) had rewards all equal, so they gave "
                    "no gradient")
        else:
            what = (f"for {step - start + 1} steps the token entropy stayed below {self.limits.entropy_ratio:.0%} of "
                    f"its start while the mean reward was flat")
        numbers = "; ".join(x for x in (reward, entropy, f"per function: {fns}" if fns else "") if x)
        return (f"step {step}: learning has stalled since step {start}: {what} ({numbers}). Likely cause: "
                f"{self.likely_cause(kind, window)}.")

    def likely_cause(self, kind: str, window: list[StepNumbers]) -> str:
        last = window[-1]
        causes = []
        e0 = self.start_entropy
        if last.entropy is not None and e0 and last.entropy < self.limits.entropy_ratio * e0:
            knobs = [f"a learning rate too high (optim.learning_rate={self.limits.learning_rate:g})",
                     f"a sampling temperature too low (rollout.temperature={self.limits.temperature:g})"]
            if self.limits.temperature < 0.7:
                knobs.reverse()
            causes.append("the policy turned near-deterministic, so a group's completions are alike and so are "
                          f"their rewards: {knobs[0]} or {knobs[1]}")
        if kind == NO_SIGNAL:
            causes += self._saturated(window)
        if not causes:
            causes.append("the completions of most groups score alike: the prompts are all solved or all failed "
                          "at this point (harder or easier prompts, or a finer-grained reward, bring the signal back)")
        return "; ".join(causes)

    def _saturated(self, window: list[StepNumbers]) -> list[str]:
        """Reward functions without spread in most groups over the stretch: at their best, their worst, or
        alike within each group."""
        out = []
        last = window[-1]
        for fn, v in last.means.items():
            z = _mean([n.zero_std_by_fn[fn] for n in window if fn in n.zero_std_by_fn])
            if z is None or z < self.limits.zero_std_fraction:
                continue
            lo, hi = self._ranges.get(fn, (v, v))
            tol = 1e-6 * max(1.0, abs(hi), abs(lo))
            if hi - lo <= tol:
                out.append(f"reward {fn} has scored {v:.4g} on every step since the start: no completion earned "
                           "anything else yet (a task too hard or too easy for the model), or the function cannot "
                           "tell completions apart")
            elif v >= hi - tol:
                out.append(f"reward {fn} saturated at {v:.4g}, its best so far: nearly every completion earns it "
                           "(the task is solved for most prompts, or the reward is too easy to satisfy)")
            elif v <= lo + tol:
                out.append(f"reward {fn} is stuck at {v:.4g}, its lowest so far: (nearly) no completion earns more "
                           "(the task is too hard for the model now, or the function never pays)")
            else:
                out.append(f"reward {fn} no longer separates the completions of a group ({z:.0%} of groups alike, "
                           f"mean {v:.4g}): each prompt is either always or never solved")
        return out

    # ------------------------------------------------------------------------- checkpoints, resume

    def protected_step(self) -> int | None:
        """The newest checkpoint at or before this step is the last one from before the stretch that is
        going on (detected, or still a candidate): pruning must spare it. None when nothing is going on."""
        starts = [s for s in (self.no_signal_since, self.low_entropy_since,
                              self.active.start_step if self.active else None) if s is not None]
        return min(starts) - 1 if starts and self.limits.steps > 0 else None

    def replay(self, history: list[dict[str, Any]]) -> None:
        """A resumed run: the steps before the checkpoint, observed again in silence."""
        for record in history:
            step = record.get("step")
            if isinstance(step, int) and step > 0 and "reward" in record:
                self.observe(step, record)


def detector_for(cfg) -> StallDetector:
    r = cfg.run
    return StallDetector(StallLimits(steps=r.stall_steps, zero_std_fraction=r.stall_zero_std_fraction,
                                     entropy_ratio=r.stall_entropy_ratio, reward_flat=r.stall_reward_flat,
                                     stop=r.stop_on_stall, learning_rate=cfg.optim.learning_rate,
                                     temperature=cfg.rollout.temperature or 1.0, grouped=not cfg.ppo))


def pre_stall_checkpoint(output_dir, stall: Stall):
    """The newest complete checkpoint from before the stretch (step <= start - 1), or None."""
    from slimgrpo.checkpoint import format as ckpt

    complete = [p for p in ckpt.list_complete(ckpt.checkpoint_dir(output_dir)) if ckpt.is_valid(p)]
    before = [p for p in complete if ckpt.checkpoint_step(p) <= stall.start_step - 1]
    return before[-1] if before else None


def stall_notice(stall: Stall, output_dir, stopping: bool, keep_best: bool = False) -> str:
    """The detection message plus what happens now and which checkpoint to go back to (``keep_best``: the
    stop still writes ``final/``, from the best model judged so far)."""
    kept = pre_stall_checkpoint(output_dir, stall)
    if kept is not None:
        where = (f"The last checkpoint from before the stall is {kept}: resume from it with the cause changed, "
                 f"run.resume={kept} and the keys you change.")
    else:
        where = "No checkpoint from before the stall exists (run.save_steps sets how often one is saved)."
    if stopping:
        final = ("final/ gets the best model judged so far (run.keep_best)" if keep_best else "without a final model")
        return f"{stall.message} Stopping here (run.stop_on_stall=true, exit code 5), {final}. {where}"
    return (f"{stall.message} Training goes on (run.stop_on_stall=true would stop here with exit code 5). "
            f"{where}")


def summary_fields(detector: StallDetector, stopped: Stall | None, output_dir) -> dict[str, Any]:
    """summary.json's record of the stretches (``stalls``) and, for a run stopped on one, ``stopped_by`` =
    ``"stall"`` and ``stall_checkpoint`` (the last checkpoint from before it, or None)."""
    out: dict[str, Any] = {}
    if detector.stalls:
        out["stalls"] = [s.record() for s in detector.stalls]
    if stopped is not None:
        kept = pre_stall_checkpoint(output_dir, stopped)
        out.update({"stopped_by": "stall", "stall_checkpoint": str(kept) if kept is not None else None})
    return out
