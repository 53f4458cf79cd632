"""The memory planner's calibration lab: the plan against measured peak RSS (``calibrate_memory``,
``plan_vs_measured``), the trace against both (``trace_check``), the published GPU anchors simulated
(``trace_anchors``) and a real model's whole window (``window``)."""
