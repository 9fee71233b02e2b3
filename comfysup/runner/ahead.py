"""The jobs an attempt takes ahead (see comfysup.runner.result): queued ahead behind its running prompt ([runner]
queue_ahead), posted at the hand-off the moment it ends, or claimed with its done; and taken back when they must
not run (a cancel, a stop, a prompt stuck ahead of them, a lost lease). One :class:`AheadJobs` per attempt holds
them, in the order the server runs them (at most two: the next job, and one queued behind it, claimed with this
attempt's done once the next one runs), their posts and their leases; the attempt asks it at the points of its
follow loop and of its end.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
from collections.abc import Callable
from typing import Any

from comfysup.comfy import ComfyError, PromptRejected
from comfysup.errors import LeaseLost, QueueUnavailable
from comfysup.logs import job_context
from comfysup.queue.base import Claim, PromptRecord
from comfysup.runner.inputs import StaleUpload
from comfysup.runner.post import post_prompt
from comfysup.runner.result import Ahead, AheadAsks, AheadPhase, ClaimArgs, Ending, Outcome
from comfysup.runner.running import Context, Run, Stop, redactor_of

log = logging.getLogger("comfysup.runner")
FRESH_RENEWAL_SECONDS = 0.5
"""How old the last renewal of an attempt's own lease (its claim by the attempt before, or that attempt's renewal
of it) may be for the download to take it as its fence (``AheadJobs.renewed_own``): a lease is many seconds, and a
runner that stalled longer renews."""


class Asked(enum.StrEnum):
    """What an attempt asks its runner for, once each (a StrEnum: a member hashes as its text, without a call)."""

    HAND_OFF = "hand_off"  # a job to post the moment this run ends on a free server
    QUEUE_AHEAD = "queue_ahead"  # a job to queue behind this run as soon as it executes
    BEHIND_NEXT = "behind_next"  # a job to queue behind the next one, claimed with this done once that one runs


_HAND_OFF, _QUEUE_AHEAD, _BEHIND_NEXT = Asked.HAND_OFF, Asked.QUEUE_AHEAD, Asked.BEHIND_NEXT
"""The members as module names, for the code that runs at every message or wake-up: in Python 3.11 reading
``Asked.X`` goes through the enum's metaclass's ``__getattr__`` hook (a call and an allocation each time),
reading a module name does not."""


class AheadJobs:
    """The jobs an attempt takes ahead (``jobs``, in the order the server runs them), renewed here until the next
    attempt takes them as its own, and taken back when they must not run.

    Given, besides the attempt's :class:`Context`: what to ask the runner (``asks``), a job the attempt before
    queued behind this one (``carried``: this attempt's next job from the start), how to interrupt a prompt
    (``interrupt``, the attempt's :class:`comfysup.runner.interrupt.Interrupter`), and when the attempt's own lease
    was last renewed without a cancel asked (``own_renewed_at``: by the attempt before, which claimed it)."""

    def __init__(self, ctx: Context, asks: AheadAsks, carried: Ahead | None,
                 interrupt: Callable[..., str | None], own_renewed_at: float | None = None) -> None:
        self.ctx = ctx
        self.asks = asks
        self.interrupt = interrupt
        self.jobs: list[Ahead] = []
        self.asked: set[Asked] = set()
        self.own_renewed_at = own_renewed_at
        """When this attempt's own lease was last renewed, fenced, with no cancel asked: see ``renewed_own``."""
        self.unrecorded: Ahead | None = None
        """The next job, posted by the attempt before once its done had committed, its number not recorded yet
        (``unrecorded_prompt``)."""
        self.behind: ClaimArgs | None = None
        """The claim of a job to queue behind the next one, which runs: made with this attempt's done."""
        if carried is not None:  # queued behind this one by the attempt before: this attempt's next job
            self.jobs.append(carried)
            self.asked.add(Asked.QUEUE_AHEAD)
            if carried.unrecorded:  # posted after the done of the attempt before: this attempt's end records it
                self.unrecorded, carried.unrecorded = carried, False

    @property
    def next(self) -> Ahead | None:
        """The next job (the first taken ahead), or None."""
        return self.jobs[0] if self.jobs else None

    @property
    def next_posted(self) -> Ahead | None:
        """The next job when it was posted here (its prompt waits in, or runs on, this server)."""
        return self.jobs[0] if self.jobs and self.jobs[0].posted else None

    def renewed_own(self, now: float) -> bool:
        """This attempt's own lease was renewed, fenced, within FRESH_RENEWAL_SECONDS (and a quarter of its
        heartbeat) of ``now`` (the attempt's clock: a stall since counts): the download's fence before it touches
        the job's files is that renewal, not another transaction."""
        at = self.own_renewed_at
        return at is not None and 0 <= now - at <= min(FRESH_RENEWAL_SECONDS, self.ctx.s.heartbeat_seconds / 4)

    # -- when to take one --------------------------------------------------------------------------------

    def may_hand_off(self, run: Run) -> bool:
        """This run has ended on its server (``executing`` with node None), the server's queue is empty, and
        it was followed on this runner's own socket: the server is free for the next job."""
        return (run.m.end_seen and run.m.queue_remaining == 0 and not self.jobs and self.asks.hand_off is not None
                and run.client is self.ctx.client and _HAND_OFF not in self.asked)

    def may_queue_ahead(self, run: Run) -> bool:
        """This run executes on this runner's own server (execution_start seen), nothing was taken ahead of it
        yet, and no stop has begun: one more job may wait in the server's queue behind it."""
        return (not self.jobs and run.m.started and not run.m.end_seen and self.asks.queue_ahead is not None
                and run.client is self.ctx.client and _QUEUE_AHEAD not in self.asked
                and self.ctx.station.stop_deadline() is None)

    def may_queue_behind_next(self, run: Run) -> bool:
        """This run has ended on its own server and the next job was posted there: once that one is seen
        executing, one more may wait behind it (see :meth:`ask_behind_next`)."""
        return (len(self.jobs) == 1 and self.jobs[0].number is not None and self.asks.queue_ahead is not None
                and run.client is self.ctx.client and _BEHIND_NEXT not in self.asked
                and self.ctx.station.stop_deadline() is None)

    # -- taking one --------------------------------------------------------------------------------------

    def hand_off(self) -> None:
        """This run is over on a free server: the next job is claimed and posted now, before this one's outputs
        are downloaded and recorded, so the server runs it meanwhile instead of waiting."""
        self.asked.add(Asked.HAND_OFF)
        ask = self.asks.hand_off
        args = ask(self.ctx.claim, Outcome(Ending.DONE, kind="done", server_free=True)) if ask else None
        self._take(args, behind=None)

    def queue_ahead(self, run: Run) -> None:
        """This run executes: one more job is queued behind it in the server's queue."""
        self.asked.add(Asked.QUEUE_AHEAD)
        ask = self.asks.queue_ahead
        self._take(ask(self.ctx.claim, run.m.queue_remaining, 1) if ask else None, behind=self.ctx.claim.id)

    def ask_behind_next(self, run: Run, read_buffered: Callable[[], None]) -> None:
        """This run's files are stored and its done comes next; the next job runs now. One more is to be queued
        behind that one: its claim rides in this done's transaction (``behind``, see :meth:`take_claimed`), and
        it is posted as soon as that commits, while the next job executes. ``read_buffered`` reads what the socket
        already holds first (the next job's start, the status broadcasts)."""
        read_buffered()
        nxt, ask = self.next, self.asks.queue_ahead
        if nxt is not None and nxt.started and ask is not None:
            self.asked.add(Asked.BEHIND_NEXT)
            self.behind = ask(nxt.claim, run.m.queue_remaining, 2)

    def may_take_behind_next(self) -> bool:
        """A job to queue behind the next one was asked for (``behind``), the next one is still this attempt's,
        posted, and no stop has begun since: the done claims it."""
        return (self.behind is not None and len(self.jobs) == 1 and self.jobs[0].number is not None
                and self.ctx.station.stop_deadline() is None)

    def take_claimed(self, claim: Claim | None, claimed_at: float, renewed_at: float) -> None:
        """The job claimed with this attempt's done: the runner's next one (posted by its own attempt), or the one to
        queue behind the next (``post_behind_next``)."""
        if claim is not None:
            self.jobs.append(Ahead(claim, claimed_at, renewed_at))

    def post_behind_next(self) -> None:
        """Post the job claimed with this attempt's done behind the next job, which executes. Its number is
        recorded by the end of the attempt it is handed to (``Ahead.unrecorded``): one transaction a job."""
        args, self.behind = self.behind, None
        if args is None or len(self.jobs) != 2 or self.jobs[1].posted:
            return
        entry = self.jobs[1]  # kept there by ``take_claimed``
        self._post(entry, args, behind=self.jobs[0].claim.id)
        if entry.number is not None:
            entry.unrecorded = True

    def _take(self, args: ClaimArgs | None, behind: str | None) -> None:
        """Claim a job and post it (``behind``: the job whose running prompt it waits behind; None: posted on a
        free server), its number recorded right after."""
        if args is None:
            return
        claimed_at, renewed_at = self.ctx.wall(), self.ctx.clock()
        try:
            claim = self.ctx.queue.leases.claim(args.owner, args.server, args.lease_seconds,
                                                prefer_model=args.prefer_model, max_wait_seconds=args.max_wait_seconds,
                                                catalogue=args.catalogue, url=self.ctx.s.url)
        except QueueUnavailable:
            return  # nothing taken ahead while the queue does not answer; this attempt's own prompt goes on
        if claim is None:
            return
        entry = Ahead(claim, claimed_at, renewed_at)
        self.jobs.append(entry)  # held whatever comes of its post
        self._post(entry, args, behind)
        if entry.number is not None:
            self._record_post(entry)

    def _post(self, entry: Ahead, args: ClaimArgs, behind: str | None) -> None:
        """Post a job claimed ahead and already among ``jobs`` (durable before its prompt is posted, as an
        attempt's own claim is). A job that may have an earlier run somewhere is posted by its own attempt, which
        looks for that run first."""
        ctx, claim = self.ctx, entry.claim
        waiting = behind is not None  # behind a prompt that runs: it waits in the server's queue (shown posted)
        if (claim.attempt != 1 or claim.last_server is not None or claim.cancel_requested
                or not args.runnable(claim) or self._ran_here(claim)):
            if waiting:  # claimed ahead, posted by its own attempt once this one ends: it waits meanwhile
                self._mark_waiting(entry)
            return
        try:
            # Queued ahead, the socket carries the running prompt's messages (and, when its attempt began with
            # them already buffered, its end): emptied, they would be lost and its end left to the next poll.
            stream = ctx.client.own_stream(drain=not waiting)
        except ComfyError:
            return  # nothing was posted: the next attempt posts it
        try:
            number = post_prompt(ctx, claim, stream.client_id)
        except ComfyError as exc:
            entry.phase, entry.error, entry.posted_at = AheadPhase.POSTED, exc, ctx.wall()
            if waiting:
                self._mark_waiting(entry)
            return
        entry.phase, entry.number, entry.posted_at, entry.waiting = AheadPhase.POSTED, number, ctx.wall(), waiting
        with job_context(claim.id, claim.attempt, redactor_of(claim)):  # its own line
            log.info("job %s attempt %d on %s: POST /prompt 200 (%s)", claim.id, claim.attempt, ctx.s.server,
                     f"queued behind job {behind}" if waiting else f"while job {ctx.claim.id} is downloaded",
                     extra={"event": "posted"})

    def _record_post(self, entry: Ahead) -> None:
        """Its number, recorded (in a transaction of its own)."""
        assert entry.number is not None
        try:
            self.ctx.queue.leases.record_prompt(entry.claim, self.ctx.s.server, entry.number, self.ctx.s.url,
                                                waiting=entry.waiting)
        except LeaseLost:
            self.drop(entry)
        except QueueUnavailable:
            pass  # its number stays in the entry; its lease is renewed with this attempt's (comfysup.runner.hold)

    def unrecorded_prompt(self) -> PromptRecord | None:
        """The prompt of the next job, posted by the attempt before after its done and not recorded yet: this
        attempt's end records it in its own transaction (``prompt_recorded`` then). A kill before that leaves the
        number unrecorded, as a kill right after any POST does: the job's next attempt looks for its prompt on
        every server (comfysup.runner.catchup)."""
        entry = self._unrecorded_kept()
        if entry is None:
            return None
        assert entry.number is not None
        return PromptRecord(entry.claim, self.ctx.s.server, entry.number, self.ctx.s.url, entry.waiting)

    def _unrecorded_kept(self) -> Ahead | None:
        """``unrecorded`` while it is still among the jobs taken ahead, with its number."""
        entry = self.unrecorded
        return entry if entry is not None and entry in self.jobs and entry.number is not None else None

    def prompt_recorded(self, held: bool) -> None:
        """This attempt's end recorded ``unrecorded_prompt``; ``held``: its claim still held (else it is dropped:
        its prompt must not run here)."""
        entry, self.unrecorded = self.unrecorded, None
        if entry is not None and not held:
            self.drop(entry)

    def record_unrecorded(self) -> None:
        """A prompt this attempt's end did not record (an end other than done, or none written): recorded now,
        in a transaction of its own, before the jobs taken ahead pass to the next attempt."""
        entry, self.unrecorded = self._unrecorded_kept(), None
        if entry is not None:
            self._record_post(entry)

    def _mark_waiting(self, entry: Ahead) -> None:
        """A job taken ahead that this attempt did not post waits for the server all the same: shown posted
        (its claim says so to its own attempt, which clears it when it posts, follows or adopts)."""
        try:
            self.ctx.queue.leases.set_waiting(entry.claim, True)
        except LeaseLost:
            self.drop(entry)
            return
        except QueueUnavailable:
            return  # shown as claimed rather than posted until its attempt says more
        entry.claim = entry.claim._replace(waiting=True)

    def _ran_here(self, claim: Claim) -> bool:
        """Whether the server already holds a history entry of the job's id (run for another queue): its
        attempt adopts it instead of posting it. Nothing to ask when the client knows every prompt the server
        was given (``may_have_run``); else one GET /history/{id} (its /queue is known empty from the
        broadcast). A server that does not answer leaves the question to the attempt."""
        try:
            return (self.ctx.client.may_have_run(claim.id)
                    and self.ctx.client.history(claim.id, self.ctx.s.max_files_per_job) is not None)
        except ComfyError:
            return True

    # -- while this attempt holds them -------------------------------------------------------------------

    def keep_message(self, prompt_id: str, message: dict[str, Any], started: bool) -> None:
        """A message of another prompt of ours: the next job's, once posted here (it runs now), is kept for its
        attempt; any other is nobody's."""
        nxt = self.next_posted
        if nxt is not None and nxt.claim.id == prompt_id:
            nxt.events.append(message)
            if started:
                nxt.phase = AheadPhase.STARTED

    def started_ahead(self) -> Claim | None:
        """The next job, when it waits as posted in the queue and its execution_start was read here: the end of
        this attempt says it executes, in its own transaction (no write of its own)."""
        nxt = self.next
        return nxt.claim if nxt is not None and nxt.waiting and nxt.started else None

    def start_recorded(self) -> None:
        """The end of this attempt recorded the next job's start (``started_ahead``)."""
        if self.next is not None:
            self.next.waiting = False

    def give_to_waiting_peer(self) -> None:
        """Another runner of this machine waits for work: the next job, waiting here behind this running prompt,
        goes back to the queue for it, uncounted, rather than wait a whole prompt's time (its server came up
        later, or it finished its last job). Asked only while this run has not ended, so the job cannot have
        started; a job queued behind the next one is left alone (that one may have ended unseen)."""
        nxt = self.next
        if (nxt is not None and nxt.number is not None and not nxt.started and self.ctx.station.peer_waiting()):
            self.withdraw_next(cancelled=False, because="another runner waiting for work", kind="withdrawn")

    def renew(self, now: float) -> None:
        """The leases of the jobs taken ahead, while this attempt holds them (a cancel of the next one takes it
        out of the server's queue; one of the job behind it is left to the next attempt, which holds it then)."""
        for entry in list(self.jobs):
            if now - entry.renewed_at < self.ctx.s.heartbeat_seconds:
                continue
            renewed_at, entry.renewed_at = entry.renewed_at, now
            try:
                cancelled = self.ctx.queue.leases.heartbeat(entry.claim, self.ctx.s.lease_seconds)
            except LeaseLost:
                self.drop(entry)
                continue
            except QueueUnavailable:
                entry.renewed_at = renewed_at  # its lease still runs from the renewal that held (comfysup.runner.hold)
                raise
            if cancelled and entry is self.next:
                self.withdraw_next(cancelled=True)

    def oldest_renewal(self) -> float:
        """The clock's time of the oldest renewal (or claim) of a job taken ahead that held; infinity: none held."""
        return min((entry.renewed_at for entry in self.jobs), default=math.inf)

    def drop(self, entry: Ahead) -> None:
        """A job taken ahead lost its lease (another runner may hold it now): its prompt must not run here. When
        the next job goes, the one queued behind it (if any) becomes the next: its prompt waits in this
        server's queue, so this attempt keeps renewing it and hands it to the next attempt."""
        if entry not in self.jobs:
            return
        self.jobs.remove(entry)
        if entry.number is not None:
            with job_context(entry.claim.id, entry.claim.attempt):
                log.warning("job %s: lost its lease before its attempt began; interrupting its prompt",
                            entry.claim.id)
            self.interrupt(Run(self.ctx.client, self.ctx.s.server, entry.number), prompt_id=entry.claim.id)

    def withdraw_next(self, cancelled: bool, because: str = "a graceful stop", kind: str = "shutdown") -> None:
        """Take the next job back: a user's cancel interrupts it wherever it is and records the cancel; otherwise
        (``because`` a graceful stop, a prompt stuck ahead of it, another runner waiting for work) it is deleted
        from the server's queue and released without counting the attempt, but only when the server shows it
        never ran: one that started meanwhile (the run ahead of it may have ended unread) stays this runner's
        next job, followed as any running job."""
        nxt = self.next
        if nxt is None or (not cancelled and not self._deleted_unrun(nxt)):
            return
        self.jobs.remove(nxt)
        claim = nxt.claim
        if cancelled and nxt.number is not None:
            with contextlib.suppress(ComfyError):
                self.ctx.client.delete_queued([claim.id])  # first: an interrupt now could only miss it
            self.interrupt(Run(self.ctx.client, self.ctx.s.server, nxt.number), prompt_id=claim.id)
        with job_context(claim.id, claim.attempt, redactor_of(claim)):
            try:
                if cancelled:
                    self.ctx.queue.leases.cancelled(claim, "cancelled by user (while queued)")
                else:
                    self.ctx.queue.leases.release(claim, f"taken out of the server's queue by {because} before it "
                                           "started; attempt not counted", count_attempt=False, kind=kind)
            except LeaseLost:
                return
            except QueueUnavailable as exc:  # out of the server's queue all the same: it never ran
                log.warning("job %s: taken out of %s's queue, but the queue does not answer (%s): it comes back "
                            "when its lease expires", claim.id, self.ctx.s.server, exc)
                return
            log.info("job %s: %s", claim.id, "cancelled while queued" if cancelled else
                     f"taken out of {self.ctx.s.server}'s queue by {because} before it started and released, attempt "
                     "not counted", extra={"event": Ending.CANCELLED if cancelled else Ending.RELEASED,
                                           "kind": "cancelled" if cancelled else kind})

    def _deleted_unrun(self, nxt: Ahead) -> bool:
        """Delete the next job's prompt from the server's queue; True when the server shows that it never ran
        (gone from /queue, no history entry), or when nothing was posted. A prompt still listed after the
        delete is running (a delete takes only a pending one); one with a history entry has run: either way it
        is marked started and kept."""
        if not nxt.posted:
            return True
        if nxt.number is None and (nxt.error is None or isinstance(nxt.error, (PromptRejected, StaleUpload))):
            return True  # refused (a 400: ComfyUI queued nothing), or never posted
        # Posted, or a post whose answer was lost (no answer, a 5xx): it may be queued, so it is looked for by id.
        client = self.ctx.client
        try:
            client.delete_queued([nxt.claim.id])
            ran = (any(e.prompt_id == nxt.claim.id for e in client.queue())
                   or client.history(nxt.claim.id, self.ctx.s.max_files_per_job) is not None)
        except ComfyError:
            ran = True  # unsure: treated as the running one is
        if ran:
            nxt.phase = AheadPhase.STARTED
        return not ran

    def lost(self, run: Run) -> None:
        """``run`` is gone from its server without a history entry (the server died or restarted under it).

        Queued behind a prompt that was lost before it was seen to end, and never seen to start itself, it never
        ran (ComfyUI runs one prompt at a time; the socket carried every message up to the loss): its attempt
        ends released, not counted. A run ahead of a job this attempt queued, lost before it was seen to end:
        that job is marked so, for its own attempt to decide the same once it finds it gone too. Anything less
        certain (a start or an end that may have been missed) is counted, as the running prompt is."""
        if run.behind_lost and not run.m.started:
            raise Stop(Outcome(Ending.RELEASED, f"queued behind a prompt that {run.server} lost (it died or "
                               "restarted) before this one started; attempt not counted", kind="server_died"))
        nxt = self.next_posted
        if (nxt is not None and nxt.number is not None and not nxt.started and run.client is self.ctx.client
                and not run.m.success_seen and not run.m.end_seen):
            nxt.behind_lost = True
