"""Every script a benchmark starts as a process of its own, so that its peak memory and its imports are its own:
``python -m benchmarks.children.NAME ...`` with the repository root as the working folder and ``PYTHONPATH``
naming the root and ``src/`` (``benchmarks.harness.processes``), also from another virtualenv (TRL's, vLLM's, the
GPU machine's)."""
