"""Run untrusted, model-generated Python in a limited child process.

Model-generated code only ever runs through ``run_sandboxed``. Each call:

* creates a fresh temporary directory, used as the working directory, ``HOME`` and ``TMPDIR``, and
  deletes it afterwards;
* starts ``sys.executable -I -S -u`` (isolated mode: no ``PYTHON*`` variables, no user or
  site-packages, so only the standard library) with an **empty environment** apart from ``PATH``,
  ``LANG``, ``HOME`` and ``TMPDIR`` (no inherited tokens or keys);
* puts the child in its own session / process group and **kills the whole group** at the end, on
  timeout, or when the output exceeds ``max_output_bytes``;
* sets resource limits in the child before the program runs: address space (``RLIMIT_AS``), CPU
  seconds, size of written files (``RLIMIT_FSIZE``), open files, no core dumps, and for non-root
  users the number of processes (``RLIMIT_NPROC``; it counts all processes of the user and does
  not apply to root, hence the audit hook below);
* installs a Python audit hook (``sys.addaudithook``) before the program runs, which refuses with
  ``PermissionError``: creating processes (fork, exec, spawn, ``subprocess``, ``os.system``),
  sending signals, sockets of any kind, ``ctypes``, changing resource limits, writing, renaming,
  deleting or changing files outside the sandbox directory, and reading files outside the sandbox
  directory, the Python installation, ``/usr``, ``/lib*``, ``/etc`` (except ``shadow`` files) and
  a few ``/dev`` and ``/proc/self`` entries (so other processes' ``/proc/<pid>/environ`` and your
  home directory's token files are out of reach);
* when ``unshare --net`` works on this machine (root, or unprivileged user namespaces), also runs
  the child in an empty network namespace. This is a bonus: the audit hook does not rely on it.

What it is not: a security boundary like a container, a VM or gVisor. The audit hook is defence in
depth at the Python level; a determined program may find a way around it (e.g. through an
interpreter bug). Run training jobs that execute untrusted code inside a container or VM as well.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

__all__ = ["SandboxResult", "run_sandboxed", "network_namespace_available"]

_READ_CHUNK = 65536


@dataclass
class SandboxResult:
    """What happened to one sandboxed program."""

    exit_code: int | None  # process status; negative: killed by that signal (-9 when we killed it)
    stdout: str  # at most max_output_bytes of standard output (decoded as UTF-8, errors replaced)
    stderr: str  # at most max_output_bytes of standard error
    timed_out: bool  # True when the wall-clock or CPU-time limit was hit
    killed_reason: str | None  # "timeout" | "cpu_limit" | "output_limit" | "memory" | "signal:NAME" | None
    duration_s: float  # wall-clock seconds from start to the end of the process group

    @property
    def ok(self) -> bool:
        """True when the program exited with status 0 within every limit."""
        return self.exit_code == 0 and self.killed_reason is None


# Runs inside the child (python -c). Reads its settings from argv[1], sets limits, installs the
# audit hook, then executes the user's program from main.py as __main__.
_BOOTSTRAP = r'''
import sys, os, json, resource, posixpath

def _sandbox_start():
    cfg = json.loads(sys.argv[1])
    work = posixpath.realpath(cfg["work_dir"])

    def user_tasks():
        uid, count = os.getuid(), 0
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.stat("/proc/" + entry).st_uid == uid:
                        count += len(os.listdir("/proc/" + entry + "/task"))
                except OSError:
                    pass
        return count

    limits = [
        (resource.RLIMIT_AS, cfg["memory_bytes"], cfg["memory_bytes"]),
        (resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1),
        (resource.RLIMIT_FSIZE, cfg["file_bytes"], cfg["file_bytes"]),
        (resource.RLIMIT_NOFILE, cfg["max_open_files"], cfg["max_open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    if cfg["max_processes"] is not None and os.getuid() != 0:
        n = user_tasks() + cfg["max_processes"]
        limits.append((resource.RLIMIT_NPROC, n, n))
    for which, soft, hard in limits:
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))

    with open(posixpath.join(work, "main.py"), encoding="utf-8") as f:
        source = f.read()

    if cfg["preload_ctypes"]:
        # Installed packages (numpy, ...) import ctypes, whose import opens libraries; do it now.
        # Every later ctypes library load, symbol lookup or foreign call is refused by the hook.
        import ctypes

    # subprocess's C helper forks without an audit event of its own: disarm it before the program runs.
    import _posixsubprocess
    def _refuse(*args, **kwargs):
        raise PermissionError("sandbox: creating processes is not allowed")
    _posixsubprocess.fork_exec = _refuse

    realpath, join, getcwd, fsdecode = posixpath.realpath, posixpath.join, os.getcwd, os.fsdecode
    own_proc = realpath("/proc/self")
    python_dirs = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                   posixpath.dirname(realpath(sys.executable)), *sys.path]
    read_roots = tuple(cfg["read_roots"]) + tuple(realpath(p) for p in python_dirs if p) + (work, own_proc)
    read_denied = ("/etc/shadow", "/etc/gshadow", "/etc/sudoers")
    write_ok = ("/dev/null",)
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    blocked = frozenset((
        "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
        "os.startfile", "subprocess.Popen", "os.kill", "os.killpg", "signal.pthread_kill",
        "resource.setrlimit", "resource.prlimit", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "sqlite3.load_extension", "sqlite3.enable_load_extension",
        "sys.remote_exec", "webbrowser.open",
    ))
    blocked_prefixes = ("socket.", "ctypes.", "_ctypes.")
    path_events = {  # event -> positions of path arguments that must lie inside the sandbox
        "os.remove": (0,), "os.rmdir": (0,), "os.rename": (0, 1), "os.mkdir": (0,),
        "os.chmod": (0,), "os.chown": (0,), "os.symlink": (1,), "os.link": (0, 1),
        "os.truncate": (0,), "os.utime": (0,), "os.setxattr": (0,), "os.removexattr": (0,),
        "os.chflags": (0,), "os.lchflags": (0,), "shutil.rmtree": (0,),
    }

    def resolve(path):
        path = fsdecode(path)
        return realpath(path if path.startswith("/") else join(getcwd(), path))

    def under(path, roots):
        return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)

    def hook(event, args):
        if event in blocked or event.startswith(blocked_prefixes):
            raise PermissionError("sandbox: " + event + " is not allowed")
        if event == "import" and args[0] == "_posixsubprocess":  # a fresh copy with the real fork_exec
            raise PermissionError("sandbox: loading _posixsubprocess again is not allowed")
        if event == "open":
            path, mode, flags = args
            if path is None or isinstance(path, int):
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & write_flags)
            if writing and fsdecode(path) in write_ok:
                return
            real = resolve(path)
            if writing and not under(real, (work,)):
                raise PermissionError("sandbox: writing outside the sandbox directory: " + real)
            if not writing and (not under(real, read_roots) or under(real, read_denied)):
                raise PermissionError("sandbox: reading this path is not allowed: " + real)
        elif event in path_events:
            for i in path_events[event]:
                p = args[i] if i < len(args) else None
                if p is not None and not isinstance(p, int) and not under(resolve(p), (work,)):
                    raise PermissionError("sandbox: " + event + " outside the sandbox directory")

    sys.argv = ["main.py"]
    sys.path.insert(0, work)
    code = compile(source, posixpath.join(work, "main.py"), "exec")
    namespace = {"__name__": "__main__", "__file__": posixpath.join(work, "main.py"), "__builtins__": __builtins__}
    sys.addaudithook(hook)
    try:
        exec(code, namespace)
    except MemoryError:
        sys.stderr.write("\nMemoryError: the sandbox memory limit was reached\n")
        sys.stderr.flush()
        os._exit(1)

_sandbox_start()
'''


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """True when ``unshare --net`` can start a process in a new, empty network namespace here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        probe = subprocess.run(
            [unshare, "--net", "--", "true"], capture_output=True, timeout=5, env={"PATH": "/usr/bin:/bin"}
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def _read_roots() -> list[str]:
    """System folders the child may read; it adds its own Python installation and ``sys.path``."""
    return ["/usr", "/lib", "/lib32", "/lib64", "/etc", "/dev/null", "/dev/zero", "/dev/urandom", "/dev/random"]


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass(frozen=True)
class SandboxLimits:
    """What a sandboxed program may use.

    ``timeout_s``: wall-clock limit; the process group is killed when it runs out (CPU time is also limited
    to about the same number of seconds). ``memory_mb``: address-space limit (``RLIMIT_AS``); allocations
    beyond it raise ``MemoryError``. ``max_output_bytes``: most bytes kept of stdout and of stderr; printing
    more kills the program. ``max_processes``: for non-root users, extra processes/threads allowed
    (``RLIMIT_NPROC``); process creation is refused by the audit hook for every user anyway.
    ``max_file_bytes``: largest file the program may write (``RLIMIT_FSIZE``). ``max_open_files``:
    ``RLIMIT_NOFILE``."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_output_bytes: int = 64_000
    max_processes: int | None = 16
    max_file_bytes: int = 16 * 2**20
    max_open_files: int = 64


def run_sandboxed(code: str, *, stdin: str = "", limits: SandboxLimits | None = None,
                  allow_site_packages: bool = False, network_namespace: bool | None = None) -> SandboxResult:
    """Run the Python program ``code`` in a limited child process and report what happened.

    Args:
        code: the whole program; it runs as ``__main__`` from ``main.py`` in a fresh temporary folder.
        stdin: text given to the program on standard input.
        limits: time, memory, output, processes, files (``SandboxLimits``; None: its defaults).
        allow_site_packages: also let the program import installed packages (drops ``-S``).
        network_namespace: run under ``unshare --net``; ``None`` (default) uses it when available.

    Returns:
        a ``SandboxResult``; ``result.ok`` is True when the program exited 0 within every limit.
    """
    limits = limits or SandboxLimits()
    timeout_s, memory_mb, max_output_bytes = limits.timeout_s, limits.memory_mb, limits.max_output_bytes
    if not isinstance(code, str):
        raise ValueError(f"run_sandboxed: code must be a string, got {type(code).__name__}")
    if timeout_s <= 0 or memory_mb <= 0 or max_output_bytes <= 0:
        raise ValueError(
            f"run_sandboxed: limits.timeout_s, memory_mb and max_output_bytes must be positive, got "
            f"{timeout_s}, {memory_mb}, {max_output_bytes}"
        )
    work = tempfile.mkdtemp(prefix="slimgrpo-sandbox-")
    start = time.monotonic()
    try:
        with open(os.path.join(work, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        with open(os.path.join(work, ".stdin"), "w", encoding="utf-8") as f:
            f.write(stdin)
        config = {
            "work_dir": work,
            "memory_bytes": int(memory_mb * 2**20),
            "cpu_s": max(1, int(timeout_s + 1.999)),
            "file_bytes": int(limits.max_file_bytes),
            "max_open_files": int(limits.max_open_files),
            "max_processes": limits.max_processes,
            "read_roots": _read_roots(),
            "preload_ctypes": bool(allow_site_packages),
        }
        flags = ["-I", "-u"] if allow_site_packages else ["-I", "-S", "-u"]
        command = [sys.executable, *flags, "-c", _BOOTSTRAP, json.dumps(config)]
        if network_namespace or (network_namespace is None and network_namespace_available()):
            command = [shutil.which("unshare") or "unshare", "--net", "--", *command]
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work}
        with open(os.path.join(work, ".stdin"), "rb") as stdin_file:
            proc = subprocess.Popen(
                command,
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=work,
                env=env,
                start_new_session=True,  # own process group: one killpg ends it and its children
                close_fds=True,
            )
        try:
            stdout, stderr, killed_reason = _collect(proc, start + timeout_s, max_output_bytes)
        finally:
            _kill_group(proc.pid)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                stream.close()
        duration = time.monotonic() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)

    exit_code = proc.returncode
    err_text = stderr.decode("utf-8", errors="replace")
    if killed_reason is None and exit_code is not None and exit_code < 0:
        sig = -exit_code
        killed_reason = "cpu_limit" if sig == signal.SIGXCPU else f"signal:{signal.Signals(sig).name}"
    if killed_reason is None and exit_code != 0 and "MemoryError" in err_text:
        killed_reason = "memory"
    return SandboxResult(
        exit_code=exit_code,
        stdout=stdout.decode("utf-8", errors="replace"),
        stderr=err_text,
        timed_out=killed_reason in ("timeout", "cpu_limit"),
        killed_reason=killed_reason,
        duration_s=duration,
    )


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Read both pipes until EOF and the process exits, the deadline passes, or output exceeds ``cap``."""
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    received = dict.fromkeys(buffers, 0)
    killed_reason = None
    with selectors.DefaultSelector() as selector:
        for fd in buffers:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map() and killed_reason is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                killed_reason = "timeout"
                break
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fd, _READ_CHUNK)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffer = buffers[key.fd]
                buffer += chunk[: max(0, cap - len(buffer))]
                received[key.fd] += len(chunk)
                if received[key.fd] > cap:
                    killed_reason = "output_limit"
                    break
    if killed_reason is None:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed_reason = "timeout"
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), killed_reason
