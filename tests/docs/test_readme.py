"""The README's two commands stay true: CI runs the README's test command verbatim."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    return [b.strip() for b in blocks]


def test_ci_runs_the_readme_test_command():
    test_cmd = next(c for c in readme_commands() if "pytest" in c)
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_readme_demo_command_runs_the_demo():
    assert any(c.endswith("slimgrpo demo") and "pip install" in c for c in readme_commands())
