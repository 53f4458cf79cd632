"""Why each test of TRL's tests/test_grpo_trainer.py that passes against TRL fails with slimgrpo.trl's classes:
``{test id (class::name[params]): (class, reason)}``, read by ``compare.py`` (which prints any failure missing
here, and any entry whose test passed). Classes:

* ``difference``: slimgrpo differs on purpose (docs/trl-migration.md says how);
* ``internal``: the test reads or patches TRL's private members or transformers ``Trainer`` internals that a
  script does not call;
* ``open``: behaviour a script could rely on that slimgrpo.trl does not have yet.
"""

CLASSES = {"difference": "(b) deliberate difference", "internal": "(c) TRL internals", "open": "(a) not fixed yet"}

FAILURES: dict[str, tuple[str, str]] = {
}
