"""What every benchmark shares: processes and their peak memory measured from outside (``measure``, ``memcap``),
how a child process is started (``processes``), the machine and load lines (``machine``), tables and plots
(``tables``), the inputs (``builders``: model folders, tokenizers, prompt files; ``rewards``: the benchmark
reward) and the records a child prints for its parent (``records``). Nothing here imports slimgrpo or TRL, so a
benchmark can measure either without loading it into its own process."""
