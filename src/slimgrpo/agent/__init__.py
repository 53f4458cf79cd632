"""Agents: multi-turn rollouts with tool calls and environments (TRL's contract) on the live weights:
the rollout loop (rollout), parsing and running tool calls (tool_calls), environments (environments), and
building them from the config (setup)."""
