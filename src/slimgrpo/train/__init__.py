"""Training, standing alone: the Python API (``trainer.py``: ``Trainer``, ``prepare_run``), the build of a run's
parts (``build.py``: ``build_run``, ``RunParts``), the step loop (``loop.py``: ``TrainLoop``), the events it raises
(``events.py``), the prompts read before any weight (``prompts.py``), the command's runner (``runner.py``), seeding
and the step's metrics. The build and the loop import no planner: ``prepare_run`` asks ``plan/admission.py`` for
the run's admission and hands it to the build (docs/architecture.md)."""
