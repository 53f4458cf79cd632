"""TRL compatibility: read the YAML that TRL 1.16's ``trl grpo`` CLI takes and map it onto slimgrpo.

The rules live with the config (``config/trl_table.py``, ``RULES``: one rule per TRL key, mapped to which
slimgrpo keys and how, ignored and why, or refused unless left at a value that changes nothing), so the config
parser can name a TRL key's slimgrpo name itself. ``slimgrpo train --trl-config grpo.yaml`` uses
``load_trl_config`` here; docs/trl-migration.md's table is generated from ``RULES``
(``scripts/gen_trl_migration.py``).
"""

from slimgrpo.config.trl_rules import Refused, Rule
from slimgrpo.config.trl_table import BY_KEY, RULES, hint_for
from slimgrpo.trl_compat.convert import Conversion, convert, load_trl_config, render


__all__ = ["BY_KEY", "Conversion", "RULES", "Refused", "Rule", "convert", "hint_for", "load_trl_config", "render"]
