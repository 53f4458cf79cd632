"""What a run is, in numbers: the model's shape (``shape.py``), the resolved spec of one step (``run.py``) and the
cost lines stages and planner share (``cost.py``)."""

from slimgrpo.runspec.cost import Component
from slimgrpo.runspec.run import RunSpec, run_spec
from slimgrpo.runspec.shape import ModelShape, load_shape, preset_shapes

__all__ = ["Component", "ModelShape", "RunSpec", "load_shape", "preset_shapes", "run_spec"]
