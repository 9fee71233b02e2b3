"""Step 3 of an attempt (docs/design.md), its driver: the follow loop of one run. It reads the socket, /history and the
clocks, feeds what it read to the run's pure machine (comfysup.runner.machine), and carries out the actions that
machine returns; between messages, it takes jobs ahead (comfysup.runner.ahead). The same wake-up serves the
download's checkpoints, once the run is over.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from functools import lru_cache, partial
from typing import Any

from comfysup.comfy import ComfyError, ServerUnavailable
from comfysup.comfyversion import tells_every_output
from comfysup.runner import follow
from comfysup.runner.ahead import AheadJobs
from comfysup.runner.hold import Keeper
from comfysup.runner.machine import (
    Action,
    EntryFromSocket,
    Fail,
    Interrupt,
    LeaseAnswer,
    Limits,
    OfferAheadToPeer,
    Phase,
    Polled,
    ReadHistory,
    RenewLeases,
    Unreachable,
    WithdrawAhead,
    Woke,
)
from comfysup.runner.record import Progress
from comfysup.runner.result import AheadPhase, Outcome
from comfysup.runner.running import Context, Heartbeat, Run, Stop
from comfysup.runner.stuck import STUCK_KIND

_ENDED, _POSTED = Phase.ENDED, AheadPhase.POSTED
"""The members as module names, for the code that runs at every message or wake-up: in Python 3.11 reading
``Phase.X`` goes through the enum's metaclass's ``__getattr__`` hook (a call and an allocation each time),
reading a module name does not."""
_every_output = lru_cache(maxsize=16)(tells_every_output)
"""``tells_every_output`` of a server's version, worked out once per version: a wake-up of a run that ended asks it."""


class FollowDriver:
    """Follows the runs of one attempt (its own; once more after an out-of-memory error). Given, besides the
    attempt's :class:`Context`: its jobs taken ahead, heartbeat clock, progress writer and limits, the messages
    to read before the socket's (``replay``), how to interrupt the run to end the attempt
    (``interrupt_to_end``), what to do once the run is seen started (``on_started``), and the attempt's hold on
    its leases (``keeper``)."""

    def __init__(self, ctx: Context, ahead: AheadJobs, heartbeat: Heartbeat, progress: Progress, limits: Limits,
                 replay: list[dict[str, Any]], interrupt_to_end: Callable[[Run], str | None],
                 on_started: Callable[[], None], keeper: Keeper) -> None:
        self.ctx = ctx
        self.ahead = ahead
        self.heartbeat = heartbeat
        self.progress = progress
        self.limits = limits
        self.replay = replay
        self.interrupt_to_end = interrupt_to_end
        self.on_started = on_started
        self.keeper = keeper

    def follow(self, run: Run) -> dict[str, Any]:
        """Until this run's history entry says success; raises Stop or ComfyError otherwise."""
        run.m.follow(self.limits, self.ctx.clock(), run.stream is not None)
        if run.adopted_entry is not None:
            return run.adopted_entry
        told = False  # on_started was called (once a run)
        while True:
            entry = self.wake(run, self.ctx.clock())  # the progress is written here, first thing each turn
            if entry is not None:
                return entry
            message = follow.receive(self.ctx, run, self.replay, run.m.wait(self.ctx.clock(), self.heartbeat.next))
            poll_in = None if message is None else follow.on_message(self.ctx, run, message, self.ahead)
            self._take_ahead(run)
            if poll_in is not None:
                run.m.poll_within(self.ctx.clock(), poll_in)
            if not told and run.m.started:  # after the posts above: the server's next job never waits for it
                told = True
                self.on_started()

    def _take_ahead(self, run: Run) -> None:
        """The jobs taken ahead after a message: queued behind this run as it executes, or posted at the hand-off
        as it ends on a free server (the job queued behind the next one is claimed with this attempt's done)."""
        ahead = self.ahead
        if ahead.may_queue_ahead(run):
            ahead.queue_ahead(run)  # this run executes: the next waits behind it in the server's queue
        if run.m.success_seen and ahead.may_hand_off(run):
            # execution_success, then the end with an empty queue: the server is idle from this moment, so the
            # next job goes to it before this run's history is read (that read costs the server a round trip
            # of idle time, and it comes next anyway).
            ahead.hand_off()

    def wake(self, run: Run, now: float) -> dict[str, Any] | None:
        """A wake-up (or a download's checkpoint): the machine's checkpoints carried out; the run's history entry
        when it was read (or made of its messages) now."""
        self.ctx.station.on_alive()
        self.progress.write(run)
        jobs = self.ahead.jobs
        unstarted = bool(jobs) and jobs[0].phase is _POSTED  # the next job waits behind this run
        connection = run.stream.connection if run.stream is not None else 0
        # Asked of the server only when it decides: a run that ended, read whole on the connection that reads.
        whole = run.m.phase is _ENDED and not run.m.over and run.m.watched_on == connection
        woke = Woke(now, self.heartbeat.due(now), self.ctx.station.stop_deadline(), unstarted, connection,
                    not whole or _every_output(run.client.version()), unstarted and self.ctx.station.peer_waiting())
        actions = run.m.step(woke)
        return self._carry_out(run, actions, now) if actions else None  # the common wake-up asks nothing

    def _carry_out(self, run: Run, actions: tuple[Action, ...], now: float) -> dict[str, Any] | None:
        """The machine's actions of a wake-up, in order; the run's history entry when one of them read it."""
        for act in actions:
            entry = _WAKE_ACTIONS[type(act)](self, run, act, now)
            if entry is not None:
                return entry
        return None

    def _renew(self, run: Run, act: Action, now: float) -> None:
        """The leases, renewed; a queue that does not answer is tried again soon while they hold (Keeper)."""
        cancelled = self.keeper.renew(partial(self._renew_all, now))
        if cancelled is not None:
            self._carry_out(run, run.m.step(LeaseAnswer(cancelled)), now)

    def _renew_all(self, now: float) -> bool:
        self.ahead.renew(now)
        return self.ctx.queue.leases.heartbeat(self.ctx.claim, self.ctx.s.lease_seconds)

    def _offer(self, run: Run, act: Action, now: float) -> None:
        self.ahead.give_to_waiting_peer()

    def _withdraw(self, run: Run, act: Action, now: float) -> None:
        self.ahead.withdraw_next(cancelled=False)

    def _from_socket(self, run: Run, act: Action, now: float) -> dict[str, Any]:
        return follow.entry_from_socket(self.ctx, run)

    def _end_interrupted(self, run: Run, act: Interrupt, now: float) -> None:
        """The attempt ends here (its timeout, a cancel, a stop): its prompt is interrupted and waited out first."""
        stuck = self.interrupt_to_end(run)
        then = act.then
        if isinstance(then, Fail):
            raise ComfyError(stuck, STUCK_KIND) if stuck else ComfyError(then.reason, then.kind)
        raise Stop(Outcome(then.ending, then.reason, kind=then.kind))

    def _poll(self, run: Run, act: Action, now: float) -> dict[str, Any] | None:
        """Read /history: the run's entry when it succeeded (with what the socket already holds read too)."""
        try:
            entry = follow.poll(self.ctx, run, self.ahead)
        except ServerUnavailable as exc:
            for act in run.m.step(Unreachable(now, exc.reason)):
                if isinstance(act, Fail):
                    raise ServerUnavailable(act.reason, act.kind) from exc
            return None
        run.m.step(Polled(now, entry is not None))
        if entry is not None:
            self._read_buffered(run)
        return entry

    def _read_buffered(self, run: Run) -> None:
        """What the socket already holds, read now without waiting: after the history said success (a poll comes
        on its own clock), so the trace closes its last nodes and a message of the next job reaches that job's
        attempt; before the done asks for a job to queue behind the next one, whose start it may hold."""
        for _ in range(1000):  # bounded: a server may keep sending (previews of the next prompt)
            if run.stream is None or (message := follow.receive(self.ctx, run, self.replay, 0.0)) is None:
                return
            if message.get("type") == "comfysup_reconnected":
                return
            follow.on_message(self.ctx, run, message, self.ahead)

    def drain(self, run: Run) -> None:
        """``_read_buffered`` once this run has ended: a failure read now is no longer this run's to raise."""
        with contextlib.suppress(ComfyError):
            self._read_buffered(run)


_WAKE_ACTIONS: dict[type, Callable[[FollowDriver, Run, Any, float], dict[str, Any] | None]] = {
    RenewLeases: FollowDriver._renew, Interrupt: FollowDriver._end_interrupted,
    OfferAheadToPeer: FollowDriver._offer, WithdrawAhead: FollowDriver._withdraw,
    EntryFromSocket: FollowDriver._from_socket, ReadHistory: FollowDriver._poll,
}
"""What the driver does for each action of a wake-up (a lease answer's own actions included)."""
