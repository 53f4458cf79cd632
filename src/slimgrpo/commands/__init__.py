"""The subcommands that sit above the library: ``slimgrpo plan`` (``plan.py``, which may run the trainer's
step on fake tensors through ``train/trace.py``) and ``slimgrpo eval`` (``eval.py``). ``slimgrpo/cli.py``
parses the command line and calls them; nothing but a command imports them."""
