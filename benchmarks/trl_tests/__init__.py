"""TRL's own ``tests/test_grpo_trainer.py`` run offline against TRL and against ``slimgrpo.trl`` (README.md).

The shell scripts set up the harness's venv, fetch the TRL test files from a TRL snapshot and run pytest with
``plugin.py``; ``standins/`` builds the local models and data sets the tests load by hub name; ``merge_results``,
``remaining`` and ``touched`` read the results and the test file. Everything they write goes under
``.bench/trl_tests/``.
"""
