"""slimgrpo's benchmarks: scripts that print tables, run from the repository root as
``python -m benchmarks.<room>.<module> ...`` (none of them is a test; benchmarks/README.md says what each
measures and how).

Rooms, one job each:

- ``harness``: what every benchmark shares: processes and their peak memory measured from outside, memory caps,
  the machine and load lines, tables, and the inputs (random-init model folders, prompt files, the reward);
- ``speed``: slimgrpo against TRL, step by step, and this machine's floor for a step;
- ``learning``: whether and how well it learns, against TRL, on real recipes;
- ``rollout``, ``update``: one part of a step measured alone (generation; the loss and the update);
- ``planner``: the memory planner's calibration lab, the plan and the trace against measured peaks;
- ``gpu``: every GPU figure in one guarded call;
- ``children``: every script a benchmark starts as a process of its own (``python -m benchmarks.children.NAME``);
- ``surface``: the slimgrpo names the benchmarks use, imported there and nowhere else.
"""
