"""The memory planner, by job:

- the memory model (``model.py``: ``plan_memory`` adds up the stages' cost lines, ``resolve`` decides what the
  config leaves to the plan; ``types.py``: ``MemoryPlan``; ``sharding.py``: FSDP2's share of each line);
- the search for settings that fit a budget (``search.py``: ``fit_to_budget``; ``longest.py``: the longest
  context that fits);
- the admission of a run (``admission.py``: ``admit``, its plan against ``memory.budget``, refused or fitted;
  ``trace_config``, the trace of a config as the run resolves it);
- the rendering (``render.py``: ``render_plan``, ``render_trace``).

Its measuring twin, the trace, is ``slimgrpo.trace``; what a run is in numbers, ``slimgrpo.runspec``.
"""

from slimgrpo.plan.admission import admit, trace_config
from slimgrpo.plan.longest import longest_context
from slimgrpo.plan.model import plan_memory, resolve
from slimgrpo.plan.render import render_plan, render_trace
from slimgrpo.plan.search import fit_to_budget, suggest_fixes
from slimgrpo.plan.types import MemoryPlan

__all__ = ["MemoryPlan", "admit", "fit_to_budget", "longest_context", "plan_memory", "render_plan", "render_trace",
           "resolve", "suggest_fixes", "trace_config"]
