"""What a run shows and writes as it goes: the console lines (console), the progress bar (progress),
metrics.jsonl and completions (metrics), the optional sinks of log.report_to (backends)."""
