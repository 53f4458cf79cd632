"""What the planner returns: the ``MemoryPlan`` (the spec and shape it was made for, its ``Component`` lines and the
peak they add up to)."""

from __future__ import annotations

from dataclasses import dataclass, field

from slimgrpo.runspec.cost import PHASES, Component
from slimgrpo.runspec.run import RunSpec
from slimgrpo.runspec.shape import ModelShape


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per component, and the peak they add up to."""

    shape: ModelShape
    inputs: RunSpec
    components: list[Component]
    peak_bytes: int  # device peak (GPU memory on cuda, process RSS on cpu), framework overhead included
    peak_phase: str  # "generation" or "update": the phase that sets the peak
    host_bytes: int  # CUDA runs: host RAM held by offloaded activations and the reference copy
    notes: list[str] = field(default_factory=list)  # warnings about the inputs

    def phase_total(self, phase: str) -> int:
        """Device bytes of the components of one phase."""
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
        return sum(c.bytes for c in self.components if c.phase == phase and c.location == "device")

    @property
    def phase_totals(self) -> dict[str, int]:
        return {p: self.phase_total(p) for p in PHASES}

    def bytes_of(self, name: str) -> int:
        """Bytes of the named component (device and host lines together)."""
        found = [c for c in self.components if c.name == name]
        if not found:
            raise ValueError(f"no component {name!r}; components are {[c.name for c in self.components]}")
        return sum(c.bytes for c in found)

    @property
    def framework_bytes(self) -> int:
        """What the device holds besides tensors: the framework (CUDA context, or the CPU process's imports) and,
        on CPU, the tokenizer."""
        return sum(c.bytes for c in self.components if c.name in ("framework overhead", "tokenizer"))

    @property
    def tensor_peak_bytes(self) -> int:
        """Peak without framework overhead: compare with torch.cuda.max_memory_allocated()."""
        return self.peak_bytes - self.framework_bytes

    def fits(self, budget_bytes: int) -> bool:
        return self.peak_bytes <= budget_bytes
