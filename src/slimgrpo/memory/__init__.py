"""The memory planner (predict peak memory per component, fit a budget) and memory tricks."""

from slimgrpo.memory.advice import fit_to_budget, parse_bytes, render_plan, suggest_fixes
from slimgrpo.memory.planner import MemoryPlan, PlanInputs, plan_memory
from slimgrpo.memory.shapes import ModelShape, load_shape, preset_shapes

__all__ = ["MemoryPlan", "ModelShape", "PlanInputs", "fit_to_budget", "load_shape", "parse_bytes",
           "plan_memory", "preset_shapes", "render_plan", "suggest_fixes"]
