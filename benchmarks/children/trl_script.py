"""A TRL script with its import changed, a process of its own (started by speed/script_vs_cli.py).

    python -m benchmarks.children.trl_script SPEC.json

SPEC: ``settings`` (GRPOConfig keywords), ``model`` (a folder), ``prompts`` (a JSONL file), ``reward`` (a module
name on PYTHONPATH and the function in it, ``module:function``). It does what such a script does, in its
order: the dataset library first, then the trainer classes, ``GRPOConfig(**settings)``, ``GRPOTrainer(...)``,
``train()``. The run's metrics.jsonl (in ``settings["output_dir"]``) holds its step times.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from datasets import load_dataset  # as a script does: the data library before the trainer

    from benchmarks.surface import TrlGRPOConfig, TrlGRPOTrainer

    module, name = spec["reward"].split(":")
    reward = getattr(importlib.import_module(module), name)
    dataset = load_dataset("json", data_files=spec["prompts"], split="train")
    trainer = TrlGRPOTrainer(model=spec["model"], reward_funcs=[reward], args=TrlGRPOConfig(**spec["settings"]),
                             train_dataset=dataset)
    trainer.train()
    return 0


if __name__ == "__main__":
    sys.exit(main())
