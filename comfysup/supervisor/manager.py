"""The one process manager of ``comfysup run`` and ``comfysup work``: runner processes and their claims.

What it owns, for both commands:

- Signals, gunicorn's way: the handler only queues the signal; a self-pipe (``signal.set_wakeup_fd``)
  ends the main loop's wait at once, so a SIGTERM or a child's exit (SIGCHLD) is acted on without delay.
- Forking runner processes (and other children, the monitor) through :class:`ProcessOps`, which ties
  each to this process's life (PR_SET_PDEATHSIG): a ``kill -9`` of the parent takes them all with it.
  A child leads its own process group and drops the parent's handlers and descriptors.
- Reaping with ``waitpid(WNOHANG)`` (``ProcessOps.reap``), and releasing a dead runner's claims the
  moment its pid is reaped: the pid's death proves that nothing acts on the job any more, so it does not
  wait for the lease. While stopping, the release does not count an attempt. At start-up, the claims of
  runners of an earlier process on this host that no longer exist (:func:`release_stale_claims`).

What to do about an exit (restart, give up, stop) is the caller's: the supervisor asks its restart
policies, ``work`` does not restart. Both stop with :class:`comfysup.supervisor.stop.StopPlan`.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import psutil

from comfysup import stopsignals
from comfysup.errors import QueueError
from comfysup.queue.base import host_name
from comfysup.runner.loop import make_owner, owner_pid
from comfysup.supervisor.process import ProcessOps, set_name

log = logging.getLogger("comfysup.supervisor")

HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass
class RunnerProcess:
    """A forked runner: the owner its claims carry, and why it was killed (for the release reason)."""

    name: str
    pid: int
    owner: str
    kill_reason: str | None = None


class ProcessManager:
    """Signals, forks, reaping and claim release; see the module's docstring."""

    def __init__(self, ops: ProcessOps, who: str = "supervisor") -> None:
        self.ops = ops
        self.who = who
        """Who is stopping, in release reasons ("supervisor stopping (…)")."""
        self.signals: list[int] = []
        self.runners: dict[int, RunnerProcess] = {}
        self._wakeup = (-1, -1)
        self._previous_handlers: dict[int, Any] = {}
        self._held: list[Any] = []
        """Files of the parent (a lock) that a child closes at once."""

    # -- signals --------------------------------------------------------------------------------------

    def install_signals(self) -> None:
        self._wakeup = self.ops.open_wakeup()
        for sig in HANDLED_SIGNALS:
            self._previous_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)

    def restore_signals(self) -> None:
        for sig, handler in self._previous_handlers.items():
            with contextlib.suppress(Exception):
                signal.signal(sig, handler)
        self._previous_handlers.clear()
        self.ops.close_wakeup(self._wakeup)
        self._wakeup = (-1, -1)

    def pop_signals(self) -> list[int]:
        signals, self.signals = self.signals, []
        return signals

    def wait(self, seconds: float) -> bool:
        """Sleep until a signal or a child's exit comes, or ``seconds`` pass; whether one came."""
        return self.ops.wait_wakeup(self._wakeup[0], seconds)

    def hold(self, handle: Any) -> None:
        """A file only this process keeps open (the supervisor's lock): children close it at once."""
        self._held.append(handle)

    # -- children -------------------------------------------------------------------------------------

    def become_child(self, name: str) -> None:
        """In a forked child: own process group, default signals, none of the parent's descriptors."""
        set_name(name)
        self.ops.new_process_group()
        for sig in self._previous_handlers:
            signal.signal(sig, signal.SIG_DFL)
        stopsignals.hold()  # a stop before the child's own handlers is kept for them, not the default death
        self.ops.close_wakeup(self._wakeup)
        for handle in self._held:
            with contextlib.suppress(OSError):
                handle.close()

    def fork(self, name: str, main: Callable[[], int]) -> int:
        """Fork a child (the monitor) that runs ``main`` as ``name``; returns its pid."""
        def child() -> int:
            self.become_child(name)
            return main()

        return self.ops.fork(child)

    def fork_runner(self, name: str, main: Callable[[str], int]) -> RunnerProcess:
        """Fork a runner process; ``main(token)`` runs in it, the token making its owner unique."""
        token = uuid.uuid4().hex[:8]
        pid = self.fork(f"comfysup-{name}", lambda: main(token))
        runner = RunnerProcess(name=name, pid=pid, owner=make_owner(name, pid, token))
        self.runners[pid] = runner
        return runner

    def kill_runner(self, pid: int, reason: str) -> None:
        """SIGKILL a runner; ``reason`` goes into the release of its claims when it is reaped."""
        runner = self.runners.get(pid)
        if runner is not None:
            runner.kill_reason = reason
        self.ops.kill(pid, signal.SIGKILL)

    def signal_runners(self, sig: int, reason: str | None = None, pids: Iterable[int] | None = None) -> None:
        for pid in list(self.runners if pids is None else pids):
            if sig == signal.SIGKILL and reason is not None:
                self.kill_runner(pid, reason)
            else:
                self.ops.kill(pid, sig)

    def reap(self) -> list[tuple[int, int]]:
        """Every child that has ended, as (pid, wait status), without blocking."""
        return self.ops.reap()

    # -- claims ---------------------------------------------------------------------------------------

    def runner_exited(self, pid: int | None, how: str, queue: Any, *, stopping: bool) -> RunnerProcess | None:
        """Forget a reaped runner and release its claims at once (not counting an attempt while stopping).
        Returns the runner, or None when the pid was not one."""
        runner = self.runners.pop(pid, None) if pid is not None else None
        if runner is None:
            return None
        reason = runner.kill_reason
        if queue is None:
            return runner
        if stopping:
            why = f"{self.who} stopping ({reason or how}); attempt not counted"
        else:
            why = f"runner process died ({reason + ', ' if reason else ''}{how})"
        try:
            released = queue.leases.release_owner(runner.owner, why, count_attempt=not stopping)
        except QueueError as exc:
            log.warning("%s: cannot release the claims of runner %s (%s); they come back when their "
                        "leases expire", runner.name, runner.owner, exc)
            released = []
        if released:
            # "released JOB: why", not "runner <why>": a why that starts "runner process died" read
            # "runner runner process died".
            log.info("%s: released %s: %s", runner.name, ", ".join(released), why)
        return runner


def release_stale_claims(queue: Any) -> list[str]:
    """Claims held by runners of an earlier supervisor on this host that no longer exist.

    A pid that exists again but was created after the claim started is another process that got the
    number, so the runner is gone all the same.
    """
    host = host_name()
    released: list[str] = []
    for job in queue.reads.status(dead_limit=0).running:
        if job.owner.split("/")[0] != host or _owner_alive(job.owner, job.started_at):
            continue
        released += queue.leases.release_owner(job.owner, "its runner (of an earlier supervisor) is gone",
                                        count_attempt=True)
    if released:
        log.info("released %d claim(s) of runners that no longer exist: %s", len(released),
                 ", ".join(released))
    return released


def _owner_alive(owner: str, claimed_at: float) -> bool:
    """The pid in the owner exists and is older than the claim (so it can be the runner that made it)."""
    pid = owner_pid(owner)
    if pid is None or not psutil.pid_exists(pid):
        return False
    try:
        process = psutil.Process(pid)
        # A zombie has stopped running (its reaper has not come yet): it acts on nothing.
        return process.status() != psutil.STATUS_ZOMBIE and process.create_time() <= claimed_at + 1.0
    except psutil.Error:
        return False
