"""Write src/slimgrpo/trl/fields.json: the fields of TRL's config dataclasses (name, type, default), the data
``slimgrpo.trl`` builds its drop-in ``GRPOConfig``, ``ModelConfig``, ``ScriptArguments`` and ``PPOConfig`` from,
so that they take TRL's arguments with TRL's defaults without TRL installed.

    python scripts/gen_trl_fields.py grpo            # with trl==1.16.0 importable: GRPOConfig and the scripts' classes
    python scripts/gen_trl_fields.py ppo             # with trl==1.12.0 importable: trl.experimental.ppo.PPOConfig
    python scripts/gen_trl_fields.py grpo --check    # exit 1 if the file is out of date for that part

Types are kept as the few the command line parsers (``transformers.HfArgumentParser``) read: bool, int, float,
str, their optional forms, lists of str / float and ``Literal`` choices; anything else (enums, accelerate's
objects) is a string. Help texts are not copied: the keys' meanings are TRL's documentation.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import sys
import typing
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "src" / "slimgrpo" / "trl" / "fields.json"
SIMPLE = {bool: "bool", int: "int", float: "float", str: "str", dict: "dict"}


def type_name(tp) -> str:
    """A parser-readable spelling of ``tp``; ``str`` (or ``str | None``) for what a parser cannot read."""
    if tp in SIMPLE:
        return SIMPLE[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "Literal[" + ", ".join(repr(a) for a in args) + "]"
    if origin is list and args and args[0] in (str, float, int):
        return f"list[{SIMPLE[args[0]]}]"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        rest = [a for a in args if a is not type(None)]
        optional = len(rest) < len(args)
        inner = type_name(rest[0]) if len(rest) == 1 else ("str" if str in rest else "str")
        if len(rest) > 1 and any(typing.get_origin(a) is list for a in rest):
            inner = "str"
        return f"{inner} | None" if optional else inner
    return "str"


def default_of(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return None
    if isinstance(value, enum.Enum):
        return value.value
    try:
        json.dumps(value)
    except TypeError:
        return None
    return value


def fields_of(cls, inherited_from=None) -> dict[str, dict]:
    hints = typing.get_type_hints(cls)
    base = {f.name for f in dataclasses.fields(inherited_from)} if inherited_from else set()
    return {f.name: {"type": type_name(hints[f.name]), "default": default_of(f),
                     **({"from": inherited_from.__name__} if f.name in base else {})}
            for f in dataclasses.fields(cls) if f.init}


def grpo() -> dict:
    import transformers
    import trl
    from trl.scripts.grpo import GRPOScriptArguments

    assert trl.__version__ == "1.16.0", trl.__version__
    return {"trl": trl.__version__,
            "GRPOConfig": fields_of(trl.GRPOConfig, transformers.TrainingArguments),
            "ModelConfig": fields_of(trl.ModelConfig),
            "ScriptArguments": fields_of(trl.ScriptArguments),
            "GRPOScriptArguments": fields_of(GRPOScriptArguments)}


def ppo() -> dict:
    import transformers
    import trl
    from trl.experimental.ppo import PPOConfig

    assert trl.__version__ == "1.12.0", trl.__version__
    return {"trl": trl.__version__, "PPOConfig": fields_of(PPOConfig, transformers.TrainingArguments)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("grpo", "ppo"))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    data = json.loads(OUT.read_text()) if OUT.is_file() else {}
    fresh = grpo() if args.part == "grpo" else ppo()
    key = {"grpo": "grpo", "ppo": "ppo"}[args.part]
    if args.check:
        stale = data.get(key) != fresh
        if stale:
            print(f"{OUT} is out of date for {key}: run python scripts/gen_trl_fields.py {key}", file=sys.stderr)
        return int(stale)
    data[key] = fresh
    OUT.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}: {', '.join(f'{c} {len(v)}' for c, v in fresh.items() if c != 'trl')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
