"""One attempt at one job, step by step (DESIGN.md "One attempt"), ending in exactly one recorded outcome.

1. Catch up: a prompt of an earlier attempt that finished is adopted from /history; one still queued is
   followed where it is. Nothing is posted twice while a run of it may still exist.
2. POST /prompt with prompt_id = job id on the runner's kept WebSocket (one client id per runner, emptied
   of earlier messages; a job posted again gets a fresh client id, so none of its earlier run's messages
   can pass for this run's); record the returned number, which tells this run's history entry from
   others of the same id.
3. Follow events after this run's execution_start; reconnect a dropped socket with the same client id;
   read /history every poll_seconds and after each reconnection (success is announced before the history
   is written, and nothing is replayed to a reconnected socket). A run whose every message from its
   execution_start to its end (``executing`` with node None, sent after ComfyUI wrote the history) was
   read on one connection needs no /history: its ``execution_success`` and ``executed`` outputs are what
   the entry holds, checked the same way. Renew the lease from this loop.
4. On the deadline (or a cancel, or the end of a graceful stop's grace) interrupt the prompt, delete it
   from the queue and wait until it has left /queue before the attempt ends.
5. Download outputs to temporary names, then rename. 6. Record done, fenced (with the next claim, in one
   transaction, when the runner goes on: see comfysup.runner.loop).

Every write to the queue is fenced; a LeaseLost anywhere ends the attempt without writing anything. A
queue that does not answer (QueueError) ends it the same way, after interrupting the prompt: the attempt
can no longer renew its lease, and the job must not still run here when the lease hands it to another
runner, perhaps on another machine that cannot see this server.

The shape: a :class:`Station` (comfysup.runner.station) holds what a runner keeps from one attempt to the
next (settings, queue, result store, the server's client and its kept WebSocket, peers' clients, the
runner's hooks and clocks); the values an attempt returns are in comfysup.runner.result.
An :class:`Attempt` lives for one attempt: ``Attempt(station, claim, ...).run()`` returns an
:class:`AttemptResult` — the outcome it recorded and, when the runner goes on, the next job it claimed
(and maybe already posted), which the runner hands to the next ``Attempt`` as a value.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from typing import Any

from comfysup.comfy import (
    ComfyError,
    MalformedAnswer,
    PermanentError,
    ServerUnavailable,
    SocketLost,
    deadline,
    new_client_id,
    wire,
)
from comfysup.comfy.history import judge, prompt_number, unlisted_savers
from comfysup.comfyversion import tells_every_output
from comfysup.errors import LeaseLost, QueueError
from comfysup.queue.base import Claim, Queue
from comfysup.runner import outputs as job_outputs
from comfysup.runner.catchup import CatchingUp
from comfysup.runner.ending import Ending
from comfysup.runner.nextjob import NextJobs
from comfysup.runner.result import AheadJob, AttemptResult, Early, NextClaim, NextJob, Outcome, Posted
from comfysup.runner.retry import Failure, decide, execution_failure, gave_up
from comfysup.runner.running import Run, ShieldedQueue, Stop, redactor_of
from comfysup.runner.station import AttemptSettings, Station
from comfysup.runner.stuck import STUCK_KIND
from comfysup.runner.trace import Trace

__all__ = ["Attempt", "AttemptResult", "AttemptSettings", "NextClaim", "NextJob", "Outcome", "Posted", "Station"]
"""Outcome, Posted and the rest are also importable from here, where the supervisor and tests find them."""

log = logging.getLogger("comfysup.runner")
READ_ON = "comfysup_read_on"
"""The key of a message kept for the next attempt (``Posted.events``) that names the connection it was read on."""
HISTORY_AFTER_SUCCESS_SECONDS = 0.05
NEXT_START_WAIT_SECONDS = 0.02
"""How long the end of a run with a job queued behind it waits for that job's start before reading its own
history: the job after it is queued first (comfysup.runner.nextjob), since the server needs it next."""
ALARM_SLACK_SECONDS = 1.0
"""The job's deadline is checked at every wake-up of the follow loop, which interrupts the prompt then; the
alarm (comfysup.comfy.deadline) falls this much later, for what no wake-up reaches: a read that blocks, a
download that trickles."""
PROGRESS_WRITE_SECONDS = 1.0
"""At most one progress write per second: a sampler's steps come faster than a queue row should change."""


class Attempt(CatchingUp, Ending, NextJobs):
    """One attempt at one job, from its claim to its recorded outcome; made for that attempt and dropped.

    The server idles from the end of one prompt to the start of the next, so the next job is started as
    early as it safely can be (given ``next_job``):
    - queued ahead (given ``ahead``, [runner] queue_ahead): once this prompt executes, one more job is
      claimed and posted behind it, so ComfyUI starts it the moment this one ends, whatever this runner is
      doing then. At most one: it is asked once, and only while the server holds no other waiting prompt of
      ours. Its lease is renewed here; a cancel of it, or a graceful stop before it started, takes it out of
      the server's queue (and records the cancel, or releases it uncounted). Once this prompt has ended and
      the queued one runs, one more is queued behind that one before this one's files are downloaded
      (comfysup.runner.nextjob), and handed to the next attempt as its own queued job;
    - the hand-off: when the prompt succeeded and the server's broadcast said its queue is empty, the next
      job is claimed and posted at once, and this job's outputs are downloaded and recorded while the
      server runs it (returned as ``AttemptResult.posted``, given to the next attempt as ``posted``);
    - otherwise a done is recorded together with the next claim, in one transaction.
    """

    def __init__(self, station: Station, claim: Claim, next_job: NextJob | None = None,
                 posted: Posted | None = None, ahead: AheadJob | None = None, behind: Early | None = None) -> None:
        self.station = station
        self.s = station.settings
        self.queue: Queue = ShieldedQueue(station.queue)  # type: ignore[assignment]
        self.client = station.client
        self.clock = station.clock
        self.wall = station.wall
        self.claim = claim
        self.next_job = next_job
        self.posted_in = posted if posted is not None and posted.claim_id == claim.id else None
        self.posted_out: Posted | None = None
        self.next_claim: Claim | None = None
        self.next_renewed = 0.0
        self.handed_off = False
        """The hand-off was tried (once an attempt: as the end is read, or after the history at the latest)."""
        self.ahead = ahead
        self.replay = list(self.posted_in.events) if self.posted_in is not None else []
        """Messages of this job's prompt read by the attempt that queued it: handled before the socket's."""
        self.ahead_tried = False
        """A job was asked for to queue behind this one (once an attempt, as soon as this one executes)."""
        self.behind_tried = False
        """A job was asked for to queue behind the next one (once an attempt, as soon as that one executes)."""
        self.then_claim: Claim | None = None
        self.then_posted: Posted | None = None
        self.then_renewed = 0.0
        """The job queued behind the next one once this one ended (see _queue_behind_next), until returned."""
        if behind is not None:  # queued behind this one by the attempt before: this attempt's next job
            self.next_claim, self.posted_out, self.next_renewed = behind.claim, behind.posted, self.clock()
            self.ahead_tried = True
        self.redact = redactor_of(claim)
        self.deadline = self.clock() + self.s.timeout_seconds
        self.next_heartbeat = self.clock() + self.s.heartbeat_seconds
        self.cancel_requested = claim.cancel_requested
        self.trace = Trace.start(claim.workflow, self.posted_in.claimed_at if self.posted_in else self.wall())
        self.progress_written_at = self.clock()
        """The first progress is written a second into the attempt: a job that ends sooner costs no write for it
        (its trace, recorded with its end, has the whole of it)."""
        self.run_over = False
        """This job's run has ended on its server (its history entry was read): a job behind it may run now."""
        self.live: Run | None = None
        """The prompt of this job known to be on a server (posted or followed), to stop if the queue goes."""
        self.timeout_due: deadline.Due | None = None
        """The alarm of the job's timeout, while the steps run under it."""

    def run(self) -> AttemptResult:
        """Run the attempt (once) and record its outcome; LeaseLost at any point means: stop, write nothing."""
        try:
            try:
                outcome = self._attempt()
            except (LeaseLost, QueueError):
                raise
            except deadline.DeadlineExceeded as exc:  # one that fell outside the steps (their own ends them)
                with deadline.suspended():
                    self._interrupt(self.live)
                outcome = Outcome("released", f"interrupted by {exc.what}; attempt not counted", kind="shutdown") \
                    if exc.kind == "stop" else self._failed(Failure("timeout", f"timed out ({exc.what})", True))
            except Exception as exc:  # a bug of ours: this attempt fails, the runner lives on
                log.exception("job %s attempt %d: internal error", self.claim.id, self.claim.attempt)
                with deadline.suspended():
                    self._interrupt(self.live)
                outcome = self._failed(Failure("internal", f"comfysup internal error: {type(exc).__name__}: {exc}",
                                               transient=True))
            outcome.reason = self.redact(outcome.reason)
            self._record(outcome)
            if outcome.state == "done":  # a dead job's run stays: a person's retry adopts it from /history
                self._remove_job_folders()
            with contextlib.suppress(QueueError):  # best-effort: the next post evicts again
                self.station.inputs.trim()  # its inputs may go now
        except LeaseLost as exc:
            return AttemptResult(Outcome("lost", str(exc), kind="lease_lost"), self.next_claim, self.posted_out,
                                 self._behind())
        except QueueError as exc:
            self._interrupt(self.live, renew=False)
            if self.live is not None and self.live.stream is not None:
                self.live.stream.close()  # idempotent; _attempt did not get the run when record_prompt failed
            return AttemptResult(
                Outcome("lost", f"the queue did not answer ({exc}); the prompt was interrupted and nothing was "
                        "recorded: the job comes back when its lease expires", kind="queue_unavailable"),
                self.next_claim, self.posted_out, self._behind())
        return AttemptResult(outcome, self.next_claim, self.posted_out, self._behind())

    def _record(self, o: Outcome) -> None:
        """The outcome, its reason class and the attempt's trace, in one fenced write."""
        self.trace.phase("recorded", self.wall())
        trace = self.trace.as_dict()
        if o.state == "done":
            more = self.next_job(self.claim, o) if self.next_job is not None and self.next_claim is None else None
            if more is not None:
                self.next_claim = self.queue.complete_and_claim(
                    self.claim, o.outputs, more.owner, more.server, more.lease_seconds, trace=trace,
                    prefer_model=more.prefer_model, max_wait_seconds=more.max_wait_seconds,
                    catalogue=more.catalogue, url=self.s.url)
            else:
                self.queue.complete(self.claim, o.outputs, trace=trace)
        elif o.state == "retry":
            self.queue.retry_later(self.claim, time.time() + o.delay_seconds, o.reason, kind=o.kind, trace=trace)
        elif o.state == "dead":
            self.queue.dead(self.claim, o.reason, kind=o.kind, trace=trace)
        elif o.state == "cancelled":
            self.queue.cancelled(self.claim, o.reason, trace=trace)
        elif o.state == "released":
            self.queue.release(self.claim, o.reason, count_attempt=False, kind=o.kind, trace=trace)

    def _write_progress(self) -> None:
        """The live progress, when it moved and a second has passed since the last write (fenced)."""
        if not self.trace.changed or self.clock() - self.progress_written_at < PROGRESS_WRITE_SECONDS:
            return
        progress = self.trace.progress()
        self.trace.changed = False
        if progress is not None:
            self.progress_written_at = self.clock()
            self.queue.set_progress(self.claim, progress)

    def _attempt(self) -> Outcome:
        """The attempt under its deadline: a read that blocks or trickles past the job's timeout (or a stop's
        grace) is interrupted by the alarm, and the prompt is interrupted after it."""
        try:
            with deadline.until(self.deadline + ALARM_SLACK_SECONDS,
                                f"the job's timeout of {self.s.timeout_seconds:g} s", kind="attempt") as due:
                self.timeout_due = due
                return self._steps()
        except deadline.DeadlineExceeded as exc:
            phase = self.trace.phases[-1][0] if self.trace.phases else "starting"
            stuck = self._interrupt(self.live)
            if self.live is not None and self.live.stream is not None and self.live.stream is not self.client.stream:
                self.live.stream.close()
            if exc.kind == "stop":
                return Outcome("released", f"interrupted by a stop ({exc.what}) while {phase}; attempt not counted",
                               kind="shutdown")
            if stuck:
                return self._failed(Failure(STUCK_KIND, stuck, transient=True))
            return self._failed(Failure("timeout", f"timed out after {self.s.timeout_seconds:g} s (while {phase}: "
                                        "the server did not answer in time)", transient=True))

    def _steps(self) -> Outcome:
        run: Run | None = None
        try:
            run = self._catch_up()
            if self.cancel_requested:
                self._interrupt(run)
                return Outcome("cancelled", "cancelled by user", kind="cancelled")
            if run is None:
                if self.claim.attempt > self.s.policy.attempts:
                    return Outcome("dead", gave_up(self.claim.attempt - 1, self.claim.last_reason), kind="gave_up")
                run = self._post()
            entry = self._follow(run)
            self.run_over = True
            if self._may_queue_behind_next(run):
                self._queue_behind_next(run)
            if self._may_hand_off(run):
                self._hand_off()
            if run.from_disk is None and (unlisted := unlisted_savers(entry, self.claim.workflow)):
                raise MalformedAnswer(f"server sent a history entry of a successful run that lists no file of "
                                      f"{', '.join(unlisted[:5])}")
            outputs = self._download(run, entry)
            return Outcome("done", kind="done", outputs=outputs, adopted=run.adopted_entry is not None,
                           adopted_from_disk=run.from_disk is not None,
                           server_free=run.end_seen and run.queue_remaining == 0 and run.client is self.client)
        except Stop as stop:
            return stop.outcome
        except ComfyError as exc:
            return self._failed(Failure(exc.kind, exc.reason, transient=not isinstance(exc, PermanentError)))
        finally:
            if run is not None and run.stream is not None and run.stream is not run.client.stream:
                run.stream.close()  # a followed run's own socket; the client's kept one stays open

    def _failed(self, failure: Failure) -> Outcome:
        decision = decide(self.s.policy, self.claim.attempt, failure)
        if decision.dead:
            return Outcome("dead", decision.reason, kind=failure.kind)
        return Outcome("retry", decision.reason, kind=failure.kind, delay_seconds=decision.delay_seconds)

    # -- 2. post ----------------------------------------------------------------------------------------

    def _post(self) -> Run:
        if self.posted_in is not None:  # posted by the previous attempt as its own run ended
            posted, self.posted_in = self.posted_in, None
            if posted.error is not None:
                raise posted.error
            self.trace.phase("posted", posted.posted_at)
            self.live = Run(self.client, self.s.server, posted.number, stream=self.client.own_stream(drain=False),
                            started=posted.started, behind_lost=posted.behind_lost)
            return self.live
        # The kept socket, emptied of what earlier prompts left in it; a job posted again gets a new client
        # id, so no message of its earlier run can be read as one of this run.
        stream = self.client.own_stream(fresh=self.claim.attempt > 1)
        if self.s.server in self.s.output_dirs and (self.claim.attempt > 1 or self.claim.last_server is not None):
            # Leftovers of an earlier run must not mix with this run's files in a later adoption.
            job_outputs.discard(self.s.output_dirs, self.s.server, self.claim.id)
        number = self._post_prompt(self.claim, stream.client_id)
        log.info("job %s attempt %d on %s: POST /prompt 200", self.claim.id, self.claim.attempt, self.s.server,
                 extra={"event": "posted"})
        self.trace.phase("posted", self.wall())
        self.live = Run(self.client, self.s.server, number, stream=stream)
        self.queue.record_prompt(self.claim, self.s.server, number, self.s.url)
        return self.live

    # -- 3. follow --------------------------------------------------------------------------------------

    def _follow(self, run: Run) -> dict[str, Any]:
        """Until this run's history entry says success; raises _Stop or ComfyError otherwise."""
        if run.adopted_entry is not None:
            return run.adopted_entry
        # A followed (caught-up) run may have finished already; a fresh one is announced on the socket.
        next_poll = self.clock() + (0.0 if run.stream is None else self.s.poll_seconds)
        unreachable_since: float | None = None
        while True:
            now = self.clock()
            self._checkpoints(run, now)
            if now >= next_poll:
                if run.success_seen and run.end_seen and self._watched_whole(run):
                    return self._entry_from_socket(run)
                try:
                    entry = self._poll(run)
                    unreachable_since = None
                except ServerUnavailable as exc:
                    unreachable_since = unreachable_since or now
                    if now - unreachable_since >= self.s.server_lost_seconds:
                        raise ServerUnavailable(f"the ComfyUI server died or stopped answering ({exc.reason})",
                                                "server_died") from exc
                    entry = None
                if entry is not None:
                    return entry
                next_poll = now + (HISTORY_AFTER_SUCCESS_SECONDS if run.success_seen else self.s.poll_seconds)
            wait = max(0.0, min(next_poll, self.deadline, self.next_heartbeat) - self.clock())
            message = self._receive(run, wait)
            poll_in = None if message is None else self._on_message(run, message)
            if self._may_queue_ahead(run):
                self._hand_off(run)  # this run executes: the next waits behind it in the server's queue
            if run.success_seen and self._may_hand_off(run):
                # execution_success, then the end with an empty queue: the server is idle from this moment, so
                # the next job goes to it before this run's history is read (that read costs the server a
                # round trip of idle time, and it comes next anyway).
                self._hand_off()
            if run.end_seen and self._may_queue_behind_next(run):
                # Ended, the job queued behind it starts: the one after that is queued before this run's history
                # is read, whose round trip would come first otherwise (a prompt of a few ms is over by then).
                if self.posted_out is not None and self.posted_out.started:
                    self._queue_behind_next(run)
                    poll_in = 0.0
                elif poll_in == 0.0:
                    poll_in = NEXT_START_WAIT_SECONDS  # its start comes next, unless the server lost it
            if poll_in is not None:
                next_poll = min(next_poll, self.clock() + poll_in)
            self._write_progress()

    def _checkpoints(self, run: Run, now: float) -> None:
        """The deadline, the heartbeat (lease, cancel) and a graceful stop, checked on every wake-up."""
        self.station.on_alive()
        self._write_progress()
        if now >= self.next_heartbeat:
            self.next_heartbeat = now + self.s.heartbeat_seconds
            self._renew_early(now)
            if self.queue.heartbeat(self.claim, self.s.lease_seconds):
                self._interrupt_to_end(run)
                raise Stop(Outcome("cancelled", "cancelled by user", kind="cancelled"))
        if now >= self.deadline:
            stuck = self._interrupt_to_end(run)
            raise ComfyError(stuck, STUCK_KIND) if stuck else ComfyError(
                f"timed out after {self.s.timeout_seconds:g} s", "timeout")
        if self.posted_out is not None:
            self._give_to_waiting_peer(run)
        stop_at = self.station.stop_deadline()
        if (stop_at is not None and self.posted_out is not None and not self.posted_out.started
                and not (run.end_seen or run.success_seen or self.run_over)):
            # Queued behind this one, which still runs: it cannot have started, and gets no grace. Once this one
            # has ended it may run (its start unread): its own attempt follows it through the grace instead.
            self._withdraw_next(cancelled=False)
        if stop_at is not None and now >= stop_at:
            self._interrupt_to_end(run)
            raise Stop(Outcome("released", "interrupted by a graceful stop; attempt not counted", kind="shutdown"))

    def _interrupt_to_end(self, run: Run) -> str | None:
        """Interrupt the run because the attempt ends here (its timeout, a cancel, a stop), seen at a wake-up: the
        job's alarm is settled first. It must not fall once the interrupt is over (a stuck prompt's restart can
        outlast ALARM_SLACK_SECONDS) and turn that end into a timeout, interrupting the job a second time."""
        if self.timeout_due is not None:
            deadline.settle(self.timeout_due)
        return self._interrupt(run)

    def _receive(self, run: Run, wait: float) -> dict[str, Any] | None:
        if self.replay:
            return self.replay.pop(0)
        if run.stream is None:
            run.stream = run.client.events(new_client_id())
            try:
                run.stream.connect()
            except SocketLost:
                run.stream = None
                time.sleep(min(wait, 0.2))
                return None
        try:
            return run.stream.recv(wait)
        except SocketLost as lost:
            # Reconnect with the same client id (the old socket is closed first), then poll /history.
            try:
                run.stream.connect()
                ok = True
            except SocketLost:
                ok = False
            self.trace.reconnected(self.wall(), ok)
            how = "reconnected with the same client id" if ok else "could not reconnect yet, trying again"
            log.warning("job %s attempt %d on %s: the WebSocket dropped (%s); %s", self.claim.id, self.claim.attempt,
                        run.server, lost.reason, how, extra={"event": "reconnected" if ok else "socket_lost"})
            if not ok:
                time.sleep(min(wait, 0.2))
            return {"type": "comfysup_reconnected", "data": {"prompt_id": self.claim.id}}

    def _on_message(self, run: Run, message: dict[str, Any]) -> float | None:
        """Handle one event; returns in how many seconds /history should be read (None: no change).

        ``execution_success`` comes before ComfyUI writes the history, ``executing`` with node None right
        after it: reading /history at the first would mostly find nothing and cost two more calls (history
        and queue), so it is read at the second, or HISTORY_AFTER_SUCCESS_SECONDS after the first at most.
        """
        kind = message.get("type")
        data = message.get("data") or {}
        if kind == "comfysup_reconnected":
            return 0.0
        if kind == "status":
            remaining = ((data.get("status") or {}).get("exec_info") or {}).get("queue_remaining")
            run.queue_remaining = remaining if isinstance(remaining, int) else None
            return None
        # The connection it was read on: the attempt that posted this job read it (tagged then), or this one now.
        connection = message.pop(READ_ON, None) or (run.stream.connection if run.stream is not None else 0)
        if data.get("prompt_id") != self.claim.id:
            if self.posted_out is not None and data.get("prompt_id") == self.posted_out.claim_id:
                # Queued ahead, it runs now: its attempt gets what was read of it here.
                self.posted_out = replace(self.posted_out, started=self.posted_out.started or kind == "execution_start",
                                          events=(*self.posted_out.events, {**message, READ_ON: connection}))
            return None
        if kind == "execution_start":
            run.started = True
            run.watched_on = connection
            run.outputs.clear()
        if not run.started:
            return None
        self.trace.on_event(kind, data, self.wall())
        if kind == "execution_start":
            return None
        if kind == "executed" and run.watched_on and data.get("output") is not None:
            run.outputs[str(data.get("node"))] = data["output"]
        if kind == "execution_success":
            run.success_seen = True
            return HISTORY_AFTER_SUCCESS_SECONDS
        if kind == "executing" and data.get("node") is None:
            run.end_seen = True
            return 0.0
        if kind == "execution_error":
            failure = execution_failure(data)
            raise ComfyError(failure.reason, failure.kind) if failure.transient else PermanentError(failure.reason,
                                                                                                   failure.kind)
        if kind == "execution_interrupted" and not run.interrupt_asked:
            raise ComfyError(f"execution_interrupted at node {data.get('node_id')} ({data.get('node_type')}), "
                             "not asked for by comfysup", "interrupted")
        return None

    def _poll(self, run: Run) -> dict[str, Any] | None:
        """This run's history entry when it succeeded; None while it runs. Raises on failure or loss."""
        entry = self._own_entry(run)
        if entry is not None:
            return judge(entry)
        if any(e.prompt_id == self.claim.id for e in run.client.queue()):
            return None
        # Not in the queue: it finished between the two reads (the history is written before the prompt
        # leaves the queue), or the server lost it.
        entry = self._own_entry(run)
        if entry is not None:
            return judge(entry)
        # The server answered: this is certain, not a reason to wait for it to come back.
        self._lost(run)
        raise ComfyError("the prompt is gone from the server's queue without a history entry "
                         "(the ComfyUI server restarted)", "server_died")

    @staticmethod
    def _watched_whole(run: Run) -> bool:
        """Every message of the run since its execution_start was read on one connection, still the one that
        reads, of a server whose messages carry every output (comfysup.comfyversion.tells_every_output)."""
        return (run.watched_on > 0 and run.stream is not None and run.stream.connection == run.watched_on
                and tells_every_output(run.client.version()))

    def _entry_from_socket(self, run: Run) -> dict[str, Any]:
        """The history entry of a run watched whole on the socket (see ``Run.watched_on``), made of its messages and
        checked as a /history answer is (at every level, at most max_files_per_job files): one GET less per
        job, and the round trip that came with it on a server that has the next prompt to run."""
        body = {self.claim.id: {"prompt": [run.number if run.number is not None else -1, self.claim.id],
                                "status": {"status_str": "success", "completed": True, "messages": []},
                                "outputs": run.outputs}}
        try:
            entry = wire.history_entry(body, self.claim.id, max_files=self.s.max_files_per_job,
                                       where="run (its executed messages)")
        except wire.Malformed as exc:
            raise MalformedAnswer(f"server sent a malformed {exc}") from None
        assert entry is not None
        return judge(entry)

    def _own_entry(self, run: Run) -> dict[str, Any] | None:
        entry = run.client.history(self.claim.id, self.s.max_files_per_job)
        if entry is not None and (run.number is None or prompt_number(entry) == run.number):
            return entry
        return None
