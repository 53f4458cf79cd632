"""The memory planner: predict peak memory per component (planner, formulas, shapes), fit a budget (advice,
check, longest), and the plan's words (tricks). Its measuring twin, the trace, is slimgrpo.trace."""

from slimgrpo.plan.advice import fit_to_budget, parse_bytes, render_plan, suggest_fixes
from slimgrpo.plan.planner import MemoryPlan, PlanInputs, plan_memory
from slimgrpo.plan.shapes import ModelShape, load_shape, preset_shapes

__all__ = ["MemoryPlan", "ModelShape", "PlanInputs", "fit_to_budget", "load_shape", "parse_bytes",
           "plan_memory", "preset_shapes", "render_plan", "suggest_fixes"]
