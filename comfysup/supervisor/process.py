"""The OS edge of the supervisor: spawning, forking, signalling and reaping, in one replaceable object.

Every child is tied to the supervisor's life with ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, set in the child
before it runs anything, followed by a check that the parent is still the one that forked it (the parent
may have died between the fork and the prctl, and then the signal would never come). So a ``kill -9`` of
the supervisor takes every ComfyUI server and runner with it, and a new supervisor finds its ports free.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import gc
import os
import select
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


class SpawnError(OSError):
    """A process could not be started."""


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def die_with_parent(parent_pid: int) -> None:
    """In a fresh child: be SIGKILLed when the parent dies, and exit now if it already has.

    Linux only (prctl); elsewhere it does nothing, and children may outlive a killed supervisor.
    """
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def set_name(name: str) -> None:
    """The name ``ps -o comm`` and ``top`` show (15 bytes), so a runner is told from its supervisor."""
    if _LIBC is not None and hasattr(_LIBC, "prctl"):
        _LIBC.prctl(PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)


def describe_status(status: int) -> str:
    """A wait status as a person reads it: ``exit code 1`` or ``killed by SIGKILL``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name}"
    if os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}"
    return f"wait status {status}"


class ProcessOps:
    """Real process calls. Tests of the supervisor's decisions replace this object.

    Everything the supervisor and ``comfysup work`` ask of the OS goes through here: spawning, forking,
    signalling, reaping, and the self-pipe that wakes the main loop when a signal or a child exit comes.
    """

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], log_path: Path, cwd: str | None = None) -> int:
        """Start a command in its own session (so its process group can be signalled as one), with
        stdout and stderr appended to ``log_path`` (O_APPEND, so copy-truncate rotation works), dying
        with this process. Returns its pid; raises SpawnError when it cannot be executed."""
        parent = os.getpid()
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log_fd, stderr=subprocess.STDOUT,
                                    env=dict(env), cwd=cwd, start_new_session=True,
                                    preexec_fn=lambda: die_with_parent(parent))
        except (OSError, subprocess.SubprocessError) as exc:
            raise SpawnError(f"cannot start {argv[0]}: {exc}") from exc
        finally:
            os.close(log_fd)
        # The pid is reaped by reap() with waitpid, not through the Popen object: forget it quietly.
        proc.returncode = 0
        return proc.pid

    def fork(self, child: Callable[[], int]) -> int:
        """Fork; the child ties itself to this process, runs ``child`` and exits with its result, never
        returning into the parent's code (no finalizers, no inherited atexit handlers)."""
        parent = os.getpid()
        # Everything alive now is kept out of the garbage collector's reach in both processes: a collection
        # in the child writes to every object it visits, and each page it writes stops being shared with
        # this process (copy-on-write), so the runner held its own copy of what both had imported.
        gc.freeze()
        try:
            pid = os.fork()
        except BaseException:
            gc.unfreeze()
            raise
        if pid:
            gc.unfreeze()
            return pid
        code = 1
        try:
            die_with_parent(parent)
            code = child()
        except SystemExit as exc:  # a child that ends itself early (a runner stopped while it waited for its queue)
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:  # the child must never unwind into the supervisor's loop
            traceback.print_exc()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def kill(self, pid: int, sig: int) -> bool:
        """Signal one process; False when it is already gone."""
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True

    def killpg(self, pgid: int, sig: int) -> bool:
        """Signal a whole process group (a server and whatever it started); False when none is left."""
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def reap(self) -> list[tuple[int, int]]:
        """Every child that has ended, as (pid, wait status), without blocking."""
        ended = []
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            if pid == 0:
                break
            ended.append((pid, status))
        return ended

    def wait_pid(self, pid: int) -> int | None:
        """Block until ``pid`` (a child already sent SIGKILL) has ended; its wait status, or None when
        it was already reaped."""
        try:
            return os.waitpid(pid, 0)[1]
        except ChildProcessError:
            return None

    def new_process_group(self) -> None:
        """In a forked child: lead a process group of its own, so Ctrl-C in a terminal reaches the parent
        alone (which then asks each child in order) and the child's group can be signalled as one."""
        os.setpgid(0, 0)

    def open_wakeup(self) -> tuple[int, int]:
        """A non-blocking self-pipe that signal delivery writes to (``signal.set_wakeup_fd``), so the main
        loop's wait ends as soon as a signal or a child's exit (SIGCHLD) comes. Returns (read, write)."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        return read_fd, write_fd

    def close_wakeup(self, fds: tuple[int, int]) -> None:
        """Stop writing signals to the pipe and close it (in the parent at the end, in a child at once)."""
        signal.set_wakeup_fd(-1)
        for fd in fds:
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def wait_wakeup(self, read_fd: int, seconds: float) -> bool:
        """Sleep until the pipe is written to or ``seconds`` pass, then empty it; whether it was written to."""
        woken = True  # a signal interrupted the wait: its handler wrote to the pipe
        with contextlib.suppress(InterruptedError):
            woken = bool(select.select([read_fd], [], [], seconds)[0])
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(read_fd, 512):
                pass
        return woken
