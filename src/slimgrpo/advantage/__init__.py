"""Advantages as pure functions of the rewards, the settings and the collectives: group-relative (GRPO) with
its scalings, RLOO, GDPO's per-function normalisation (``estimators.py``), the run's choice among them
(``compute.py``) and PPO's per-token GAE over the critic's values (``gae.py``); no model, no torch.distributed."""
