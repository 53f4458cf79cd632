"""TRL compatibility: read the YAML that TRL 1.16's ``trl grpo`` CLI takes and map it onto slimgrpo.

``RULES`` (table.py) holds one rule per TRL key: mapped (to which slimgrpo keys, how), ignored (why) or
refused unless left at a value that changes nothing (why). ``slimgrpo train --trl-config grpo.yaml`` uses
``load_trl_config``; docs/trl-migration.md's table is generated from ``RULES``
(``scripts/gen_trl_migration.py``), which also writes ``hint_for``'s sentences into
``slimgrpo/config/trl_names.py`` for the config parser's unknown-key errors (config never imports this package).
"""

from slimgrpo.trl_compat.convert import Conversion, convert, load_trl_config, render
from slimgrpo.trl_compat.rules import Refused, Rule
from slimgrpo.trl_compat.table import BY_KEY, RULES


def hint_for(key: str) -> str | None:
    """A sentence for a TRL key written in a slimgrpo config (``bf16``, ``gradient_accumulation_steps``)."""
    rule = BY_KEY.get(key)
    if rule is None:
        return None
    if rule.kind == "map" and rule.targets:
        note = f" ({rule.note})" if rule.note else ""
        return f"{key!r} is TRL's name: in slimgrpo use {' and '.join(rule.targets)}{note}."
    if rule.kind == "map":
        return f"{key!r} is TRL's: {rule.note}."
    return f"{key!r} is TRL's and has no slimgrpo key: {rule.note}."


__all__ = ["BY_KEY", "Conversion", "RULES", "Refused", "Rule", "convert", "hint_for", "load_trl_config", "render"]
