"""Keep tokens and keys out of saved configs, logs and checkpoints."""

from __future__ import annotations

import os
import re
from typing import Any

REDACTED = "<redacted>"

# Keys whose values are secrets by name.
_SECRET_KEY = re.compile(r"(^|[_\-])(token|secret|password|passwd|api_?key|access_?key|secret_?key)s?$", re.I)
# Values that look like well-known credential formats.
_SECRET_VALUE = re.compile(
    r"(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_\-]{20,}|ghp_[A-Za-z0-9]{20,}|xox[abp]-[A-Za-z0-9\-]{10,}"
    r"|AKIA[0-9A-Z]{16})"
)
# Environment variables never to echo.
_SECRET_ENV = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "MLFLOW_TRACKING_TOKEN")


def _env_secrets() -> list[str]:
    values = []
    for name, value in os.environ.items():
        if (name in _SECRET_ENV or _SECRET_KEY.search(name)) and len(value) >= 8:
            values.append(value)
    return values


def scrub_text(text: str) -> str:
    """Replace credential-looking substrings and the values of secret environment variables."""
    for value in _env_secrets():
        text = text.replace(value, REDACTED)
    return _SECRET_VALUE.sub(REDACTED, text)


def scrub(obj: Any, key: str = "") -> Any:
    """A copy of a nested dict/list with secret-named keys and secret-looking strings redacted."""
    if isinstance(obj, dict):
        return {k: scrub(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [scrub(v, key) for v in obj]
    if isinstance(obj, str):
        if key and _SECRET_KEY.search(key) and obj:
            return REDACTED
        return scrub_text(obj)
    return obj


class ScrubFilter:
    """A logging filter that redacts secrets from every record's formatted message (and its args)."""

    def filter(self, record) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: let the handler report it as usual
            return True
        clean = scrub_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install_log_filter(logger=None, on_logger: bool = False) -> None:
    """Redact secrets in log lines. By default the filter goes on every handler of ``logger`` (the root
    logger when None), so third-party records are covered too; ``on_logger=True`` puts it on the logger
    itself, which covers the records logged through that logger whatever handlers exist."""
    import logging

    logger = logger or logging.getLogger()
    targets = [logger] if on_logger else list(logger.handlers)
    for target in targets:
        if not any(isinstance(f, ScrubFilter) for f in target.filters):
            target.addFilter(ScrubFilter())
