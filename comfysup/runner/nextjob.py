"""The next job of a runner, started early by the attempt before it (see :class:`comfysup.runner.attempt.Attempt`):
queued ahead behind the running prompt ([runner] queue_ahead), or handed off the moment it ends; and taken back
when it must not run (a cancel, a stop, a prompt stuck ahead of it, a lost lease). One :class:`EarlyJobs` per
attempt holds these jobs, their posts and their leases; the attempt asks it at the points of its follow loop.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import replace

from comfysup.comfy import ComfyError, PromptRejected
from comfysup.errors import LeaseLost
from comfysup.logs import job_context
from comfysup.queue.base import Claim
from comfysup.runner.follow import on_message
from comfysup.runner.inputs import StaleUpload
from comfysup.runner.post import post_prompt
from comfysup.runner.result import AheadJob, Early, NextClaim, NextJob, Outcome, Posted
from comfysup.runner.running import Context, Run, Stop, redactor_of

log = logging.getLogger("comfysup.runner")
FRESH_RENEWAL_SECONDS = 0.5
"""How old the renewal made with the record of the job queued behind the next one may be for the download to take
it as its fence (``EarlyJobs.renewed_own``): a lease is many seconds, and a runner that stalled longer renews."""


class EarlyJobs:
    """The jobs an attempt claims early, and what becomes of them: the next one (``next_claim``, with its
    ``posted_out`` once posted), queued behind this run or posted at its hand-off, and the one queued behind the
    next (``then_claim``), renewed here until the next attempt takes them as its own, and taken back when they
    must not run.

    Given, besides the attempt's :class:`Context`: the runner's ``next_job`` and ``ahead`` (None: the runner
    stops after this job, or [runner] queue_ahead is off), the job queued behind this one by the attempt
    before (``behind``: this attempt's next job from the start), and how to interrupt a prompt (``interrupt``,
    the attempt's :class:`comfysup.runner.interrupt.Interrupter`)."""

    def __init__(self, ctx: Context, next_job: NextJob | None, ahead: AheadJob | None, behind: Early | None,
                 interrupt: Callable[..., str | None]) -> None:
        self.ctx = ctx
        self.next_job = next_job
        self.ahead = ahead
        self.interrupt = interrupt
        self.next_claim: Claim | None = None
        self.posted_out: Posted | None = None
        self.next_renewed = 0.0
        self.handed_off = False
        """The hand-off was tried (once an attempt: as the end is read, or after the history at the latest)."""
        self.ahead_tried = False
        """A job was asked for to queue behind this one (once an attempt, as soon as this one executes)."""
        self.behind_tried = False
        """A job was asked for to queue behind the next one (once an attempt, as soon as that one executes)."""
        self.then_claim: Claim | None = None
        self.then_posted: Posted | None = None
        self.then_renewed = 0.0
        """The job queued behind the next one once this one ended (see queue_behind_next), until returned."""
        self.own_renewed_at: float | None = None
        """When this attempt's own lease was last renewed with the record of a job queued behind the next one (it
        held, no cancel asked): see ``renewed_own``."""
        if behind is not None:  # queued behind this one by the attempt before: this attempt's next job
            self.next_claim, self.posted_out, self.next_renewed = behind.claim, behind.posted, ctx.clock()
            self.ahead_tried = True

    def renewed_own(self, now: float) -> bool:
        """This attempt's own lease was renewed, fenced, within FRESH_RENEWAL_SECONDS (and a quarter of its
        heartbeat) of ``now`` (the attempt's clock: a stall since counts): the download's fence before it touches
        the job's files is that renewal, not another transaction."""
        at = self.own_renewed_at
        return at is not None and 0 <= now - at <= min(FRESH_RENEWAL_SECONDS, self.ctx.s.heartbeat_seconds / 4)

    def may_hand_off(self, run: Run) -> bool:
        """This run has ended on its server (``executing`` with node None), the server's queue is empty, and
        it was followed on this runner's own socket: the server is free for the next job."""
        return (self.next_job is not None and not self.handed_off and self.next_claim is None and run.end_seen
                and run.queue_remaining == 0 and run.client is self.ctx.client)

    def may_queue_ahead(self, run: Run) -> bool:
        """This run executes on this runner's own server (execution_start seen), nothing was claimed behind
        it yet, and no stop has begun: one more job may wait in the server's queue behind it."""
        return (self.ahead is not None and not self.ahead_tried and self.next_claim is None and run.started
                and not run.end_seen and run.client is self.ctx.client and self.ctx.station.stop_deadline() is None)

    def may_queue_behind_next(self, run: Run) -> bool:
        """This run has ended on its own server and the job queued behind it was posted there: once that one is
        seen executing, one more may wait behind it (see :meth:`queue_behind_next`)."""
        return (self.ahead is not None and not self.behind_tried and self.then_claim is None
                and self.next_claim is not None and self.posted_out is not None and self.posted_out.number is not None
                and run.client is self.ctx.client and self.ctx.station.stop_deadline() is None)

    def queue_behind_next(self, run: Run) -> None:
        """This run has ended; the job queued behind it runs now. One more is queued behind that one before this
        one's files are downloaded and recorded, so the server never waits for that work either (a prompt of
        20 ms is over before it: the next one would be posted late). Its claim is this attempt's (``then_claim``,
        renewed here) until the next attempt takes it over as its own next job."""
        self._read_buffered(run)
        posted = self.posted_out
        if posted is not None and posted.started and self.next_claim is not None and self.ahead is not None:
            self.behind_tried = True  # once: as its start is read, or after this run's history at the latest
            self.hand_off(self.ahead(self.next_claim, run.queue_remaining, 2), then=True)

    def _read_buffered(self, run: Run) -> None:
        """What the socket already holds, without waiting: the next job's start, the status broadcasts."""
        if run.stream is None:
            return
        with contextlib.suppress(ComfyError):
            while (message := run.stream.recv(0.0)) is not None:
                on_message(self.ctx, run, message, self)

    def hand_off(self, run: Run | NextClaim | None = None, then: bool = False) -> None:
        """Claim the next job and post it now, before this one's outputs are downloaded and recorded: the
        server runs it meanwhile instead of waiting. As in an attempt's own post, the claim is durable
        before the prompt is posted and its number is recorded right after; a job that may have an earlier
        run somewhere is claimed here but posted by its own attempt, which looks for that run first.
        ``then``: ``run`` is the claim to make, behind the next job (:meth:`queue_behind_next`)."""
        claimed_at = self.ctx.wall()
        behind = self.ctx.claim.id
        if then:
            more = run if isinstance(run, NextClaim) else None
            behind = self.next_claim.id if self.next_claim is not None else behind
        elif isinstance(run, Run):  # queued ahead, behind this run (which executes now)
            self.ahead_tried = True
            more = self.ahead(self.ctx.claim, run.queue_remaining, 1) if self.ahead else None
        else:
            self.handed_off = True
            done = Outcome("done", kind="done", server_free=True)
            more = self.next_job(self.ctx.claim, done) if self.next_job else None
        if more is None:
            return
        nxt = self.ctx.queue.leases.claim(more.owner, more.server, more.lease_seconds, prefer_model=more.prefer_model,
                               max_wait_seconds=more.max_wait_seconds, catalogue=more.catalogue, url=self.ctx.s.url)
        if nxt is None:
            return
        self._keep(then, nxt, None)
        waiting = run is not None  # behind a prompt that runs: it waits in the server's queue (shown posted)
        if (nxt.attempt != 1 or nxt.last_server is not None or nxt.cancel_requested or not more.runnable(nxt)
                or self._ran_here(nxt)):
            if waiting:  # claimed ahead, posted by its own attempt once this one ends: it waits meanwhile
                self._mark_waiting(then, nxt)
            return
        try:
            # Queued ahead, the socket carries the running prompt's messages (and, when its attempt began with
            # them already buffered, its end): emptied, they would be lost and its end left to the next poll.
            stream = self.ctx.client.own_stream(drain=run is None)
        except ComfyError:
            return  # nothing was posted: the next attempt posts it
        try:
            number = post_prompt(self.ctx, nxt, stream.client_id)
        except ComfyError as exc:
            self._keep(then, nxt, Posted(nxt.id, claimed_at, self.ctx.wall(), error=exc))
            if waiting:
                self._mark_waiting(then, nxt)
            return
        self._keep(then, nxt, Posted(nxt.id, claimed_at, self.ctx.wall(), number=number, waiting=waiting))
        with job_context(nxt.id, nxt.attempt, redactor_of(nxt)):  # its own line
            log.info("job %s attempt %d on %s: POST /prompt 200 (%s)", nxt.id, nxt.attempt, self.ctx.s.server,
                     f"queued behind job {behind}" if run is not None else
                     f"while job {self.ctx.claim.id} is downloaded", extra={"event": "posted"})
        # Behind the next job, this attempt's own files come next: its lease is renewed in the same transaction,
        # the fence the download needs before it touches them (``renewed_own``), one transaction a job fewer.
        own = self.ctx.claim if then else None
        try:
            renewed = self.ctx.queue.leases.record_prompt(nxt, self.ctx.s.server, number, self.ctx.s.url,
                                                          waiting=waiting, renew=own,
                                                          lease_seconds=self.ctx.s.lease_seconds)
        except LeaseLost:
            self.drop_next(then)
            return
        if renewed:
            self.own_renewed_at = self.ctx.clock()

    def _mark_waiting(self, then: bool, nxt: Claim) -> None:
        """A job claimed ahead that this attempt did not post waits for the server all the same: shown posted
        (its claim says so to its own attempt, which clears it when it posts, follows or adopts)."""
        try:
            self.ctx.queue.leases.set_waiting(nxt, True)
        except LeaseLost:
            self.drop_next(then)
            return
        held = replace(nxt, waiting=True)
        if then:
            self.then_claim = held
        else:
            self.next_claim = held

    def started_behind(self) -> Claim | None:
        """The next job, when it waits as posted in the queue and its execution_start was read here: the end of
        this attempt says it executes, in its own transaction (no write of its own)."""
        posted = self.posted_out
        if posted is not None and posted.waiting and posted.started and self.next_claim is not None:
            return self.next_claim
        return None

    def start_recorded(self) -> None:
        """The end of this attempt recorded the next job's start (``started_behind``)."""
        if self.posted_out is not None:
            self.posted_out = replace(self.posted_out, waiting=False)

    def behind(self) -> Early | None:
        """The job queued behind the next one, handed to the next attempt with it (None: none)."""
        return None if self.then_claim is None else Early(self.then_claim, self.then_posted)

    def _keep(self, then: bool, claim: Claim, posted: Posted | None) -> None:
        """Hold a job claimed early: the next one (``next_claim``, ``posted_out``), or the one behind it."""
        if then:
            if posted is None:
                self.then_renewed = self.ctx.clock()
            self.then_claim, self.then_posted = claim, posted
        else:
            if posted is None:
                self.next_renewed = self.ctx.clock()
            self.next_claim, self.posted_out = claim, posted

    def give_to_waiting_peer(self, run: Run, run_over: bool) -> None:
        """Another runner of this machine waits for work: a job that waits here behind this running prompt goes
        back to the queue for it, uncounted, rather than wait a whole prompt's time (its server came up later,
        or it finished its last job). Only while this run has not ended, so the job cannot have started; a job
        queued behind the next one is left alone (that one may have ended unseen: the next attempt decides)."""
        posted = self.posted_out
        if (posted is not None and posted.number is not None and not posted.started
                and not (run.end_seen or run.success_seen or run_over) and self.ctx.station.peer_waiting()):
            self.withdraw_next(cancelled=False, because="another runner waiting for work", kind="withdrawn")

    def renew_early(self, now: float) -> None:
        """The leases of the jobs claimed early, while this attempt holds them (a cancel of the next one takes
        it out of the server's queue; one of the job behind it is left to the next attempt, which holds it
        then)."""
        if self.next_claim is not None and now - self.next_renewed >= self.ctx.s.heartbeat_seconds:
            # Handed off, running on the server while this one downloads (not renewed just after its claim).
            self.next_renewed = now
            try:
                if self.ctx.queue.leases.heartbeat(self.next_claim, self.ctx.s.lease_seconds):
                    self.withdraw_next(cancelled=True)
            except LeaseLost:
                self.drop_next()
        if self.then_claim is not None and now - self.then_renewed >= self.ctx.s.heartbeat_seconds:
            self.then_renewed = now
            try:
                self.ctx.queue.leases.heartbeat(self.then_claim, self.ctx.s.lease_seconds)
            except LeaseLost:
                self.drop_next(then=True)

    def _ran_here(self, nxt: Claim) -> bool:
        """Whether the server already holds a history entry of the next job's id (run for another queue): its
        attempt adopts it instead of posting it. Nothing to ask when the client knows every prompt the server
        was given (``may_have_run``); else one GET /history/{id} (its /queue is known empty from the
        broadcast). A server that does not answer leaves the question to the attempt."""
        try:
            return (self.ctx.client.may_have_run(nxt.id)
                    and self.ctx.client.history(nxt.id, self.ctx.s.max_files_per_job) is not None)
        except ComfyError:
            return True

    def _pop(self, then: bool) -> tuple[Claim | None, Posted | None]:
        """Let go of a job claimed early: the next one, or (``then``) the one behind it. When the next one goes,
        the one queued behind it (if any) becomes the next: its prompt waits in this server's queue, so this
        attempt keeps renewing it and hands it to the next attempt, which follows it there."""
        if then:
            nxt, posted = self.then_claim, self.then_posted
            self.then_claim = self.then_posted = None
        else:
            nxt, posted = self.next_claim, self.posted_out
            self.next_claim, self.posted_out, self.next_renewed = self.then_claim, self.then_posted, self.then_renewed
            self.then_claim = self.then_posted = None
        return nxt, posted

    def drop_next(self, then: bool = False) -> None:
        """The next job's lease is gone (another runner may hold it now): its prompt must not run here."""
        nxt, posted = self._pop(then)
        if nxt is not None and posted is not None and posted.number is not None:
            with job_context(nxt.id, nxt.attempt):
                log.warning("job %s: lost its lease before its attempt began; interrupting its prompt", nxt.id)
            self.interrupt(Run(self.ctx.client, self.ctx.s.server, posted.number), prompt_id=nxt.id)

    def withdraw_next(self, cancelled: bool, because: str = "a graceful stop", kind: str = "shutdown") -> None:
        """Take the job queued behind this one back: a user's cancel interrupts it wherever it is and records
        the cancel; otherwise (``because`` a graceful stop, a prompt stuck ahead of it, another runner waiting
        for work) it is deleted from the server's queue and released without counting the attempt, but only
        when the server shows it never ran: one that started meanwhile (the run ahead of it may have ended
        unread) stays this runner's next job, followed as any running job."""
        if not cancelled and not self._deleted_unrun():
            return
        nxt, posted = self._pop(then=False)
        if nxt is None:
            return
        if cancelled and posted is not None and posted.number is not None:
            with contextlib.suppress(ComfyError):
                self.ctx.client.delete_queued([nxt.id])  # first: an interrupt now could only miss it
            self.interrupt(Run(self.ctx.client, self.ctx.s.server, posted.number), prompt_id=nxt.id)
        with job_context(nxt.id, nxt.attempt, redactor_of(nxt)):
            try:
                if cancelled:
                    self.ctx.queue.leases.cancelled(nxt, "cancelled by user (while queued)")
                else:
                    self.ctx.queue.leases.release(nxt, f"taken out of the server's queue by {because} before it "
                                                  "started; attempt not counted", count_attempt=False, kind=kind)
            except LeaseLost:
                return
            log.info("job %s: %s", nxt.id, "cancelled while queued" if cancelled else
                     f"taken out of {self.ctx.s.server}'s queue by {because} before it started and released, attempt "
                     "not counted", extra={"event": "cancelled" if cancelled else "released",
                                           "kind": "cancelled" if cancelled else kind})

    def _deleted_unrun(self) -> bool:
        """Delete the next job's prompt from the server's queue; True when the server shows that it never ran
        (gone from /queue, no history entry), or when nothing was posted. A prompt still listed after the
        delete is running (a delete takes only a pending one); one with a history entry has run: either way it
        is marked started and kept."""
        nxt, posted = self.next_claim, self.posted_out
        if nxt is None or posted is None:
            return True
        if posted.number is None and (posted.error is None or isinstance(posted.error, (PromptRejected, StaleUpload))):
            return True  # refused (a 400: ComfyUI queued nothing), or never posted
        # Posted, or a post whose answer was lost (no answer, a 5xx): it may be queued, so it is looked for by id.
        try:
            self.ctx.client.delete_queued([nxt.id])
            ran = (any(e.prompt_id == nxt.id for e in self.ctx.client.queue())
                   or self.ctx.client.history(nxt.id, self.ctx.s.max_files_per_job) is not None)
        except ComfyError:
            ran = True  # unsure: treated as the running one is
        if ran:
            self.posted_out = replace(posted, started=True)
        return not ran

    def lost(self, run: Run) -> None:
        """``run`` is gone from its server without a history entry (the server died or restarted under it).

        Queued behind a prompt that was lost before it was seen to end, and never seen to start itself, it never
        ran (ComfyUI runs one prompt at a time; the socket carried every message up to the loss): its attempt
        ends released, not counted. A run ahead of a job this attempt queued, lost before it was seen to end:
        that job is marked so, for its own attempt to decide the same once it finds it gone too. Anything less
        certain (a start or an end that may have been missed) is counted, as the running prompt is."""
        if run.behind_lost and not run.started:
            raise Stop(Outcome("released", f"queued behind a prompt that {run.server} lost (it died or restarted) "
                               "before this one started; attempt not counted", kind="server_died"))
        posted = self.posted_out
        if (posted is not None and posted.number is not None and not posted.started and run.client is self.ctx.client
                and not run.success_seen and not run.end_seen):
            self.posted_out = replace(posted, behind_lost=True)
