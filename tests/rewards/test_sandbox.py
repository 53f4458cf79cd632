"""The sandbox for model-generated code, against hostile programs."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time

import pytest

from slimgrpo.rewards.sandbox import SandboxLimits, SandboxResult, run_sandboxed

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox relies on Linux rlimits and /proc")


def _group_alive(pgid: int) -> bool:
    """True while any process (zombies aside) remains in process group ``pgid``."""
    out = subprocess.run(["ps", "-eo", "pgid=,stat="], capture_output=True, text=True).stdout
    return any(int(p) == pgid and not s.startswith("Z") for p, s in (line.split() for line in out.splitlines()))


def test_correct_program_exits_zero_with_output():
    result = run_sandboxed("import sys\nprint('hello', sys.stdin.read().strip())\n", stdin="world")
    assert isinstance(result, SandboxResult)
    assert result.ok and result.exit_code == 0
    assert result.stdout == "hello world\n"
    assert not result.timed_out and result.killed_reason is None


def test_failing_program_reports_its_error():
    result = run_sandboxed("def f():\n    raise ValueError('boom')\nf()\n")
    assert result.exit_code == 1 and not result.ok
    assert "ValueError: boom" in result.stderr and result.killed_reason is None
    assert run_sandboxed("import sys; sys.exit(3)").exit_code == 3


def test_infinite_loop_times_out():
    start = time.monotonic()
    result = run_sandboxed("while True:\n    pass\n", limits=SandboxLimits(timeout_s=1.0))
    assert time.monotonic() - start < 2.0
    assert result.timed_out and result.killed_reason == "timeout" and not result.ok


def test_memory_bomb_is_stopped_and_parent_unaffected():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = run_sandboxed("blocks = []\nwhile True:\n    blocks.append(bytearray(50 * 2**20))\n",
                           limits=SandboxLimits(memory_mb=256))
    assert not result.ok and result.killed_reason == "memory"
    assert "MemoryError" in result.stderr
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024  # KiB: parent did not grow


def test_fork_loop_is_contained_and_leaves_no_processes():
    program = (
        "import importlib.util, os, subprocess\n"
        "def fresh_posixsubprocess():  # a new module instance would bring back the real fork_exec\n"
        "    spec = importlib.util.find_spec('_posixsubprocess')\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "for attempt in (lambda: os.fork(), lambda: subprocess.Popen(['sleep', '60']),\n"
        "                lambda: os.system('sleep 60 &'), lambda: __import__('_posixsubprocess').fork_exec(),\n"
        "                lambda: fresh_posixsubprocess()):\n"
        "    try:\n"
        "        attempt()\n"
        "        print('escaped')\n"
        "    except PermissionError as e:\n"
        "        print('refused', flush=True)\n"
        "print(os.getpid(), flush=True)\n"
        "while True:\n"
        "    os.fork()\n"
    )
    result = run_sandboxed(program, limits=SandboxLimits(timeout_s=2.0))
    lines = result.stdout.split()
    assert lines[:5] == ["refused"] * 5 and "escaped" not in result.stdout
    assert not result.ok and "os.fork is not allowed" in result.stderr
    # The child led its own process group (pgid == its pid); nothing of that group may survive.
    pgid = int(lines[5])
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert not _group_alive(pgid)


def test_process_group_is_killed_even_when_the_program_is_still_running():
    result = run_sandboxed("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(30)\n",
                           limits=SandboxLimits(timeout_s=0.5))
    assert result.timed_out
    assert not _group_alive(int(result.stdout.split()[0]))


def test_writing_outside_the_sandbox_is_refused(tmp_path):
    target = tmp_path / "escaped.txt"
    program = (
        "import os\n"
        "open('inside.txt', 'w').write('fine')\n"
        "print(open('inside.txt').read(), flush=True)\n"
        f"try:\n    os.rename('inside.txt', {str(target)!r})\nexcept PermissionError:\n    print('rename refused')\n"
        f"open({str(target)!r}, 'w').write('pwned')\n"
    )
    result = run_sandboxed(program)
    assert result.stdout.splitlines() == ["fine", "rename refused"]
    assert "PermissionError" in result.stderr and not result.ok
    assert not target.exists()
    home_file = os.path.expanduser("~/.slimgrpo_sandbox_probe")
    result = run_sandboxed(f"import os\nos.close(os.open({home_file!r}, os.O_WRONLY | os.O_CREAT))\n")
    assert not result.ok and not os.path.exists(home_file)


def test_environment_is_not_inherited(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "secret")
    program = (
        "import os\n"
        "print(os.environ.get('HF_TOKEN'))\n"
        f"try:\n    print(open('/proc/{os.getpid()}/environ').read())\n"
        "except PermissionError:\n    print('refused')\n"
        "try:\n    print(open('/proc/1/environ').read())\nexcept PermissionError:\n    print('refused')\n"
    )
    result = run_sandboxed(program)
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == ["None", "refused", "refused"]
    assert "secret" not in result.stdout


def test_printing_gigabytes_is_capped_and_killed_quickly():
    start = time.monotonic()
    result = run_sandboxed("while True:\n    print('x' * 1_000_000)\n",
                           limits=SandboxLimits(max_output_bytes=10_000, timeout_s=5.0))
    assert time.monotonic() - start < 2.0
    assert result.killed_reason == "output_limit" and not result.ok
    assert len(result.stdout) == 10_000


def test_network_is_refused():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        program = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')\n"
        result = run_sandboxed(program, limits=SandboxLimits(timeout_s=3.0))
        assert not result.ok and "connected" not in result.stdout
        assert "socket" in result.stderr
        with pytest.raises(BlockingIOError):
            server.accept()
    finally:
        server.close()


def test_ctypes_and_limits_cannot_be_lifted():
    result = run_sandboxed("import ctypes\n")
    assert not result.ok and "ctypes" in result.stderr
    result = run_sandboxed("import resource\nresource.setrlimit(resource.RLIMIT_AS, (-1, -1))\n")
    assert not result.ok and "resource.setrlimit" in result.stderr
    result = run_sandboxed(f"import os\nos.kill({os.getpid()}, {int(signal.SIGTERM)})\n")
    assert not result.ok and "os.kill" in result.stderr


def test_working_directory_is_fresh_and_removed():
    result = run_sandboxed("import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\n")
    folder, listing = result.stdout.splitlines()
    assert "slimgrpo-sandbox-" in folder and "main.py" in listing
    assert not os.path.exists(folder)


def test_bad_arguments():
    with pytest.raises(ValueError, match="timeout_s"):
        run_sandboxed("print(1)", limits=SandboxLimits(timeout_s=0))
    with pytest.raises(ValueError, match="string"):
        run_sandboxed(b"print(1)")  # type: ignore[arg-type]
