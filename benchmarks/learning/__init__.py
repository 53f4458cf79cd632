"""Whether it learns: real recipes trained by slimgrpo and by TRL, scored on held-out questions by one evaluator
(``learn_vs_trl``, ``learn_suite``, sharing ``runs`` and ``trl_config``), keep_best's judge replayed
(``replay_judge``), bf16 weights against float32 (``bf16_learn``). ``tasks/`` holds recipes kept out of
``examples/``."""
