"""The run's health, judged after each step: the non-finite streak and collapse (health), stalls (stall), the
best model and early stopping (best), one RunWatch over them (watch)."""
