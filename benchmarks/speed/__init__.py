"""How fast a step runs: slimgrpo against TRL's GRPOTrainer (``vs_trl``, with its W-long tables in ``w_long``)
and PPOTrainer (``ppo_vs_trl``), and this machine's floor for a step (``floor``)."""
