"""Local stand-ins for the hub models and data sets TRL's GRPO tests load (build_standins.py)."""
