"""Optional metric sinks next to metrics.jsonl (``log.report_to``): tensorboard, wandb, trackio, mlflow.

Each backend imports its package only when asked for, so none of them is a dependency of slimgrpo;
a missing one stops the run before training with the pip extra that installs it. A backend is any
object with ``log(step, record)``, ``log_completions(step, samples)`` and ``close()`` (the ``Backend``
protocol): :class:`slimgrpo.output.metrics.MetricsWriter` calls them. Create backends on the main process only.

Secrets: the config is scrubbed (:func:`slimgrpo.redact.scrub`) before any backend sees it, and so
are sample completions, which can echo whatever a prompt contained.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Protocol

from slimgrpo.config.report_to import BACKENDS, CHOICES, parse_report_to  # noqa: F401 (the backends' names)
from slimgrpo.redact import scrub

_MODULE = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}


class BackendUnavailable(ImportError, ValueError):
    """``log.report_to`` names a backend whose package is not installed (a user error, hence ValueError)."""


class Backend(Protocol):
    """A metric sink: every step's record, sample completions (``log.log_completions_steps``), the end."""

    def log(self, step: int, record: dict[str, Any]) -> None: ...

    def log_completions(self, step: int, samples: list[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


# ----------------------------------------------------------------------------- shared helpers


def _require(name: str):
    """Import the package behind backend ``name`` or raise BackendUnavailable naming the pip extra."""
    import importlib

    try:
        if name == "tensorboard":
            # torch's writer needs the tensorboard package; import both so either failing is caught here.
            importlib.import_module("tensorboard")
            return importlib.import_module("torch.utils.tensorboard")
        return importlib.import_module(_MODULE[name])
    except ImportError as e:
        raise BackendUnavailable(
            f"log.report_to includes {name!r} but the {_MODULE[name]!r} package is not installed "
            f"({e}). Install it with: pip install 'slimgrpo[{name}]'  (or drop {name!r} from log.report_to)",
            name=_MODULE[name],
        ) from None


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numeric values of a metrics record (null = undefined this step, left out)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key == "step" or value is None:
            continue
        if isinstance(value, bool):
            value = int(value)
        if isinstance(value, (int, float)) and math.isfinite(value):
            out[key] = float(value)
    return out


def _text(value: Any) -> str:
    """A prompt/completion as one string: conversations become ``role: content`` lines."""
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        return "\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in value)
    return value if isinstance(value, str) else json.dumps(value)


def sample_table(samples: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Columns and rows for a completions table, secrets scrubbed, texts flattened to strings."""
    columns: list[str] = []
    for s in samples:
        columns += [k for k in s if k not in columns]
    rows = []
    for s in scrub([dict(s) for s in samples]):
        row = []
        for c in columns:
            v = s.get(c)
            row.append(_text(v) if c in ("prompt", "completion") else v)
        rows.append(row)
    return columns, rows


def _flat_params(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in config.items():
        if isinstance(v, dict):
            out.update(_flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v) if not isinstance(v, str) else v
    return out


# ----------------------------------------------------------------------------- backends


class TensorBoardBackend:
    """Event files under ``RUN_DIR/tensorboard`` (``tensorboard --logdir RUN_DIR/tensorboard``)."""

    def __init__(self, run_dir: str | Path, config: dict[str, Any]):
        module = _require("tensorboard")
        self.logdir = Path(run_dir) / "tensorboard"
        self.writer = module.SummaryWriter(log_dir=str(self.logdir))
        # Four-space indent: TensorBoard's text tab renders markdown, this keeps the JSON as code.
        body = "\n".join("    " + line for line in json.dumps(config, indent=2).splitlines())
        self.writer.add_text("config", body, 0)

    def log(self, step: int, record: dict[str, Any]) -> None:
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, step)

    def log_completions(self, step: int, samples: list[dict[str, Any]]) -> None:
        columns, rows = sample_table(samples)

        def cell(v: Any) -> str:
            text = "" if v is None else (f"{v:.4g}" if isinstance(v, float) else str(v))
            return text.replace("|", "\\|").replace("\n", " ⏎ ")

        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self.writer.add_text("completions", "\n".join(lines), step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class WandbBackend:
    """Weights & Biases; project from ``WANDB_PROJECT`` (default ``slimgrpo``), run named after RUN_DIR.
    Credentials come from wandb's own login / ``WANDB_API_KEY``, never from the config."""

    def __init__(self, run_dir: str | Path, config: dict[str, Any]):
        self.wandb = _require("wandb")
        self.run = self.wandb.init(project=os.environ.get("WANDB_PROJECT", "slimgrpo"),
                                   name=Path(run_dir).resolve().name, config=config, dir=str(run_dir))

    def log(self, step: int, record: dict[str, Any]) -> None:
        self.run.log(scalars(record), step=step)

    def log_completions(self, step: int, samples: list[dict[str, Any]]) -> None:
        columns, rows = sample_table(samples)
        self.run.log({"completions": self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioBackend:
    """Hugging Face trackio (local by default); project from ``TRACKIO_PROJECT`` (default ``slimgrpo``)."""

    def __init__(self, run_dir: str | Path, config: dict[str, Any]):
        self.trackio = _require("trackio")
        self.trackio.init(project=os.environ.get("TRACKIO_PROJECT", "slimgrpo"),
                          name=Path(run_dir).resolve().name, config=config)

    def log(self, step: int, record: dict[str, Any]) -> None:
        self.trackio.log(scalars(record), step=step)

    def log_completions(self, step: int, samples: list[dict[str, Any]]) -> None:
        table_cls = getattr(self.trackio, "Table", None)
        if table_cls is None:  # older trackio: metrics only
            return
        columns, rows = sample_table(samples)
        self.trackio.log({"completions": table_cls(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.trackio.finish()


_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /]")


class MlflowBackend:
    """MLflow fluent API; tracking URI and experiment from mlflow's own environment variables
    (``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``); the config goes in as run parameters."""

    def __init__(self, run_dir: str | Path, config: dict[str, Any]):
        self.mlflow = _require("mlflow")
        self.run = self.mlflow.start_run(run_name=Path(run_dir).resolve().name)
        params = {k: v[:500] for k, v in _flat_params(config).items()}  # mlflow caps param values
        items = list(params.items())
        for i in range(0, len(items), 100):  # and params per request
            self.mlflow.log_params(dict(items[i:i + 100]))

    def log(self, step: int, record: dict[str, Any]) -> None:
        metrics = {_MLFLOW_BAD_CHARS.sub("_", k): v for k, v in scalars(record).items()}
        self.mlflow.log_metrics(metrics, step=step)

    def log_completions(self, step: int, samples: list[dict[str, Any]]) -> None:
        columns, rows = sample_table(samples)
        data = {c: [row[i] for row in rows] for i, c in enumerate(columns)}
        self.mlflow.log_table(data=data, artifact_file=f"completions/step_{step:06d}.json")

    def close(self) -> None:
        self.mlflow.end_run()


_CLASSES = {"tensorboard": TensorBoardBackend, "wandb": WandbBackend, "trackio": TrackioBackend,
            "mlflow": MlflowBackend}


def make_backends(report_to: list[str] | str | None, run_dir: str | Path,
                  config_dict: dict[str, Any] | None = None) -> list[Backend]:
    """Backends named by ``log.report_to`` (``none`` = no extra sinks), ready to pass to MetricsWriter.

    Every package is checked before any backend starts, so a missing one fails fast without leaving
    half-created runs behind. ``config_dict`` (e.g. ``cfg.to_dict()``) is scrubbed of secrets first.
    """
    names = parse_report_to(report_to)
    for name in names:
        _require(name)
    config = scrub(dict(config_dict or {}))
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    backends: list[Backend] = []
    try:
        for name in names:
            backends.append(_CLASSES[name](run_dir, config))
    except BaseException:
        for backend in backends:
            backend.close()
        raise
    return backends
