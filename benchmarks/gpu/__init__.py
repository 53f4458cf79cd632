"""Every GPU figure in one guarded call (``python -m benchmarks.gpu.suite``). The driver side imports neither torch
nor slimgrpo: ``suite`` (sections, budgets, the report's JSON), ``setup`` (wheels and the import probe), ``runner``
(child processes with a wall-clock limit, their output read back), ``report`` (the markdown). The child side
(``benchmarks.children.gpu_task``) runs one task: ``tasks`` (every task by name), ``train_e2e`` (``slimgrpo train``
end to end, then resumed), ``measure`` (the measurements), ``guard`` (a time limit per row) and ``workloads``
(sizes, shapes, synthetic prompts)."""
