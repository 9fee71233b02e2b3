"""The runner process: claim a job only when its server can run it, run one attempt, repeat.

A runner blocks on its server. It claims only while the server answers and holds fewer than
``max_queue`` prompts of other clients, so several runners pulling from one queue make a
"least loaded server" scheduler with no scheduler. Signals only set flags; the loop acts on them.

Between two jobs the server waits, so that stretch is kept short: the next job is taken ahead
(comfysup.runner.ahead). When a prompt has succeeded and the server's own ``status`` broadcast said its queue
is empty, the next job is claimed and posted at once and the finished one's files are downloaded and recorded
while the server runs it (the hand-off). Otherwise the next claim rides in the transaction that records the
done (``Queue.complete_and_claim``). Either way the claim prefers the model the server ran last, and no GET
/queue is asked when the broadcast already answered it.

Better still ([runner] queue_ahead): once a prompt executes, one more job is claimed and queued ahead behind
it, so ComfyUI starts it the moment the running one ends while this runner downloads and records (see
Attempt). One at most per server, and only while the server holds fewer than ``max_queue`` prompts of other
clients.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from comfysup import stopsignals
from comfysup.comfy import CLIENT_PREFIX, ComfyError, MalformedAnswer, deadline
from comfysup.config import Config
from comfysup.errors import DatabaseLocked, DatabaseUnavailable, LeaseLost, QueueError
from comfysup.logs import bind, job_context
from comfysup.queue import open_queue
from comfysup.queue.base import Claim, Queue, host_name
from comfysup.queue.watch import EXIT_DATABASE_REPLACED, QueueWatch
from comfysup.redact import bound
from comfysup.runner.attempt import Attempt
from comfysup.runner.catalogue import ServerCatalogue
from comfysup.runner.objectstore import result_store
from comfysup.runner.options import RunnerHooks, RunnerOptions
from comfysup.runner.result import Ahead, AheadAsks, ClaimArgs, Ending, Outcome
from comfysup.runner.running import redactor_of
from comfysup.runner.station import AttemptSettings, Station, queue_wait_seconds
from comfysup.runner.stuck import OutOfService, StuckChannel

log = logging.getLogger("comfysup.runner")
QUEUE_RETRY_SECONDS = 1.0
"""How often a runner whose queue database does not answer tries it again (claiming nothing meanwhile)."""


def make_owner(server: str, pid: int | None = None, token: str | None = None) -> str:
    """host/pid/server/token: unique per runner process; the pid lets a supervisor prove it dead.

    A supervisor picks ``token`` before it forks the runner, so it knows the owner of the child's claims
    (``make_owner(server, child_pid, token)``) without asking the child.
    """
    return f"{host_name()}/{pid or os.getpid()}/{server}/{token or uuid.uuid4().hex[:8]}"


def owner_pid(owner: str) -> int | None:
    parts = owner.split("/")
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


NO_OPTIONS = RunnerOptions()
NO_HOOKS = RunnerHooks()
"""A runner nobody supervises: every hook does nothing."""

settings_from = AttemptSettings.from_config
"""A runner's attempt settings, from [runner] (the one place their defaults are written)."""


@dataclass
class RunnerState:
    """Flags set by signal handlers and read by the loop (gunicorn's arbiter style)."""

    stopping: bool = False
    stop_deadline: float | None = None
    counts: Counter[str] = field(default_factory=Counter)


class Runner:
    """One server's runner: ``Runner(config, server, url, options, hooks).run()`` claims and runs its jobs until
    stopped (or, with ``options.until_empty``, until none is left). ``queue``: an open queue to use (else the
    config's, waited for while its database does not answer)."""

    def __init__(self, config: Config, server: str, url: str, options: RunnerOptions = NO_OPTIONS,
                 hooks: RunnerHooks = NO_HOOKS, queue: Queue | None = None) -> None:
        self.config = config
        self.server = server
        bind(slot=server)  # every log line of this runner names its slot
        self.owner = make_owner(server, token=options.owner_token)
        self.until_empty = options.until_empty
        self.hooks = hooks
        self.state = RunnerState()
        self.queue_down_since: float | None = None
        self.queue = queue or self._open_queue(config, hooks.on_alive)
        self.queue.checkpoint_in_background()  # no commit of this runner's waits for a WAL checkpoint
        self.watch = QueueWatch(self.queue, every_seconds=config.runner.heartbeat_seconds)
        """The queue's file: deleted, replaced or corrupt, no job is claimed any more (comfysup.queue.watch)."""
        self.problem = ""
        self.stuck = hooks.stuck or StuckChannel()
        self.out_of_service = OutOfService()
        """When nobody restarts the server (comfysup work): no claim for it until its queue is empty."""
        store = result_store(config)  # a folder, or a bucket staged through it ([store] url)
        settings = settings_from(config, server, url, options.peers, options.output_dirs)
        self.station = Station(settings, self.queue, store, stop_deadline=lambda: self.state.stop_deadline,
                               on_alive=hooks.on_alive, stuck=self.stuck if self.stuck.restarts else
                               StuckChannel(False, self._stuck_here, self.stuck.pending),
                               peer_waiting=hooks.peer_waiting, memory=hooks.memory)
        self.catalogue = ServerCatalogue(self.queue, self.station.client, server)
        """The server's /object_info, recorded in the queue at start and after the server was seen down."""
        self.idle_seconds = min(config.runner.poll_seconds, 0.25)
        self.last_model: str | None = None
        """The model key of what this runner's server ran last (None: unknown, or unloaded since)."""
        self._counted: str | None = None

    def may_claim(self) -> bool:
        """The queue's file is still this runner's, and its supervisor lets it claim."""
        return self.watch.check() is None and self.hooks.may_claim()

    # -- signals --------------------------------------------------------------------------------------

    def install_signals(self) -> None:
        stopsignals.install(self._on_signal)  # and a stop that came while the runner was being set up

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Flags for the loop, and the deadline of whatever is blocked now brought to the stop's: a download
        that trickles or a server that never answers cannot hold a stop past its grace (the attempt then
        interrupts its prompt and gives the job back uncounted)."""
        if self.state.stopping:
            self.state.stop_deadline = time.monotonic()  # a second signal: stop now
            deadline.shorten(0.0, "a second stop signal")
        else:
            self.state.stopping = True
            grace = self.config.runner.grace_seconds
            self.state.stop_deadline = time.monotonic() + grace
            deadline.shorten(grace, f"a graceful stop's grace of {grace:g} s")

    # -- the loop -------------------------------------------------------------------------------------

    def run(self) -> Counter[str]:
        """Claim and run until stopped (or, with until_empty, until no job is left to do)."""
        deadline.keep_between()  # a deadline per call and per job, all this process's life
        self.catalogue.refresh()
        try:
            self._stopping(self._loop())
        finally:
            self.hooks.on_waiting(False)  # gone: its peers no longer leave work for it
            self.station.close()
            self.queue.close()
        if self.watch.lost is not None:  # the reason is its parent's to say (comfysup run or work): said once
            log.info("%s: no job is claimed any more: the queue's file is lost (exit code %d)", self.server,
                     EXIT_DATABASE_REPLACED)
            raise SystemExit(EXIT_DATABASE_REPLACED)
        return self.state.counts

    def _loop(self) -> tuple[Ahead, ...]:
        """Turns until stopped, drained or the queue's file lost; returns the jobs the last attempt took ahead."""
        taken: tuple[Ahead, ...] = ()  # the jobs the last attempt took ahead, the next first
        while not self.state.stopping:
            self.hooks.on_alive()
            if taken:  # taken ahead by the last attempt: queued, at its hand-off, or with its done
                taken = self.run_one(taken[0].claim, taken)
                continue
            claim, stop = self._claim_turn()
            if stop:
                break
            if claim is not None:
                taken = self.run_one(claim)
        return taken

    def _claim_turn(self) -> tuple[Claim | None, bool]:
        """A turn with no job in hand: a claim when the server can take one (None: none now), and whether the
        loop ends (drained, or the queue's file lost)."""
        warmup = self.hooks.warmup
        if warmup is not None:  # its server is starting, so it may not claim: nothing is held now
            warmup.step(self.server, self.station.client, self.hooks.on_alive, lambda: self.state.stopping)
        allowed = self.may_claim()
        if self.watch.lost is not None:
            return None, True
        free = allowed and self._in_service() and self._server_free()
        if free:
            self.catalogue.refresh()
        try:
            claim, drained = self._claim(free)
        except QueueError as exc:
            self._queue_down(exc)
            return None, False
        self._queue_up()
        if drained:
            return None, True
        # Waiting for work: no job, and nothing of its own server's stops it from taking one (the supervisor's
        # "may not claim" is its own to weigh: it is in the same block).
        self.hooks.on_waiting(claim is None and (free or not allowed))
        if claim is None:
            # PostgreSQL returns at the NOTIFY of a new job; SQLite sleeps. Either way at most idle_seconds, so
            # a stop flag set by a signal is seen soon.
            self.queue.wait_for_work(self.idle_seconds)
        return claim, False

    def _claim(self, free: bool) -> tuple[Claim | None, bool]:
        """A job, when the server is free (None: none now), and whether the queue is drained (with until_empty:
        no job left to do); the queue's maintenance when none was claimed."""
        claim = self.queue.leases.claim(self.owner, self.server, self.config.runner.lease_seconds,
                                 catalogue=self.catalogue.id, url=self.station.settings.url,
                                 **self._affinity()) if free else None
        drained = claim is None and self.until_empty and self.queue.reads.active_count() == 0
        if claim is None:
            self.queue.maintenance()
        return claim, drained

    def _stopping(self, taken: tuple[Ahead, ...]) -> None:
        """The loop ended with ``taken`` in hand. A job already posted ahead is run: its attempt follows it
        through the grace and interrupts it after, as any running job; left alone it would run here unowned (a
        job queued behind it is taken out of the server's queue by that attempt, uncounted). A job claimed and
        not started is given back, uncounted."""
        while taken and taken[0].posted:
            taken = self.run_one(taken[0].claim, taken)
        if taken:
            with contextlib.suppress(QueueError):
                self.queue.leases.release(taken[0].claim, "the runner stopped before starting it", count_attempt=False,
                                   kind="shutdown")

    def _open_queue(self, config: Config, on_alive: Callable[[], None]) -> Queue:
        """The queue, waited for while its database does not answer: a runner that crashed instead would be
        restarted in a loop until its supervisor marked the slot failed."""
        while True:
            if stopsignals.pending():  # stopped while the database did not answer: nothing to take, nothing held
                raise SystemExit(0)
            try:
                # Its supervisor (run or work) made the queue: one deleted since is not made again empty here.
                queue = open_queue(config, create=False, wait_seconds=queue_wait_seconds(config))
            except (DatabaseUnavailable, DatabaseLocked) as exc:  # not a wrong config: that must fail
                on_alive()
                self._queue_down(exc)
                continue
            self._queue_up()
            return queue

    def _queue_down(self, exc: QueueError) -> None:
        """Say once that the database does not answer; claim nothing until it does (retried every second)."""
        if self.queue_down_since is None:
            self.queue_down_since = time.monotonic()
            log.error("%s: the queue does not answer (%s); claiming nothing until it does", self.server, exc)
        end = time.monotonic() + QUEUE_RETRY_SECONDS
        while not self.state.stopping and not stopsignals.pending() and time.monotonic() < end:
            time.sleep(min(0.05, max(0.0, end - time.monotonic())))

    def _queue_up(self) -> None:
        if self.queue_down_since is not None:
            log.info("%s: the queue answers again after %.0f s; claiming again", self.server,
                     time.monotonic() - self.queue_down_since)
            self.queue_down_since = None

    def run_one(self, claim: Claim, taken: tuple[Ahead, ...] = ()) -> tuple[Ahead, ...]:
        """One attempt (``taken``: the jobs the last attempt took ahead, ``claim``'s first); returns the jobs
        this attempt took ahead, the runner's next first."""
        with job_context(claim.id, claim.attempt, redactor_of(claim)):
            if not (taken and taken[0].posted) and self._refused(claim):
                return ()
            self.hooks.on_job(claim, None)
            self._counted = None
            asks = AheadAsks(self._hand_off_claim, self._queue_ahead_claim if self.config.runner.queue_ahead else None)
            result = Attempt(self.station, claim, asks, taken).run()
            outcome = result.outcome
            self.state.counts[outcome.state] += 1
            if self._counted != claim.id:
                self.hooks.on_job(claim, outcome)
            self.last_model = self._model_after(claim, outcome)
            self._log(claim, outcome)
        return result.ahead

    def _affinity(self) -> dict[str, Any]:
        """The claim's model preference: the model its server ran last, within [runner]
        affinity_max_wait_seconds of strict priority order."""
        return {"prefer_model": self.last_model, "max_wait_seconds": self.config.runner.affinity_max_wait_seconds}

    @staticmethod
    def _model_after(claim: Claim, outcome: Outcome) -> str | None:
        """What the server holds after this attempt: its model, unless the server died or ran out of memory
        (ComfyUI unloads models after an OOM) or the prompt never reached it."""
        if outcome.kind in ("connection", "server_died", "oom", "lease_lost", "queue_unavailable", "stuck"):
            return None
        return claim.model_key

    def _count(self, claim: Claim, outcome: Outcome) -> None:
        """The attempt is over on the server: counted before the next claim is considered (a supervisor
        recycling after N jobs must see this one before it answers may_claim), and only once."""
        if self._counted != claim.id:
            self.hooks.on_job(claim, outcome)
            self._counted = claim.id

    def _hand_off_claim(self, claim: Claim, outcome: Outcome) -> ClaimArgs | None:
        """Whether the attempt of ``claim`` may claim the next job for this server now (see Attempt): at its
        hand-off, or in the transaction that records its done.

        The server is free when its own broadcast said so; otherwise GET /queue decides, as before any
        claim."""
        self._count(claim, outcome)
        if self.state.stopping or not self.may_claim():
            return None
        if not outcome.server_free and not self._server_free():
            return None
        r = self.config.runner
        return ClaimArgs(self.owner, self.server, r.lease_seconds, claim.model_key, r.affinity_max_wait_seconds,
                         self.catalogue.id, self.catalogue.runnable)

    def _queue_ahead_claim(self, claim: Claim, queue_remaining: int | None, uncounted: int = 1) -> ClaimArgs | None:
        """Whether a job may be queued behind ``claim``'s prompt, which executes on this server now: not
        while stopping or about to be recycled (``uncounted``: this runner's jobs on the server not counted
        yet), and only when the server holds no other waiting prompt of ours and fewer than max_queue of other
        clients. Its broadcast ``queue_remaining`` of 1 (the running prompt alone) or 0 (the prompt before it
        over already: a runner slower than the prompts, on a busy CPU server) says so; otherwise GET /queue
        decides (a round trip to a server that executes: it waited for ComfyUI's GIL)."""
        if (self.state.stopping or not self.may_claim() or not self.hooks.may_queue_ahead(uncounted)
                or self.hooks.peer_waiting()):
            return None
        if queue_remaining not in (0, 1):
            try:
                entries = self.station.client.queue()
            except (ComfyError, deadline.DeadlineExceeded):
                return None
            ours = [e for e in entries if (e.client_id or "").startswith(CLIENT_PREFIX)]
            if any(not e.running for e in ours):
                return None  # the bound: one prompt of ours waits behind the running one, never two
            if len(entries) - len(ours) >= self.config.runner.max_queue:
                return None
        r = self.config.runner
        return ClaimArgs(self.owner, self.server, r.lease_seconds, claim.model_key, r.affinity_max_wait_seconds,
                         self.catalogue.id, self.catalogue.runnable)

    def _refused(self, claim: Claim) -> bool:
        """A job this server's catalogue cannot run (a catalogue that changed since the submit): left for a
        server that can, its attempt not counted, or dead-lettered when no server can. True when left."""
        reason = self.catalogue.refusal(claim)
        if reason is None or self.catalogue.id is None:
            return False
        try:
            dead = self.queue.fleet.refuse(claim, self.catalogue.id, reason)
        except (LeaseLost, QueueError) as exc:
            log.warning("job %s: its refusal by %s's catalogue was not recorded: %s", claim.id, self.server, exc)
            return True
        self.state.counts[Ending.DEAD if dead else "refused"] += 1
        if dead:
            log.info("job %s: dead-lettered, no server can run it (here: %s)", claim.id, reason,
                     extra={"event": Ending.DEAD, "kind": "catalogue"})
        else:
            log.info("job %s: left for another server without counting the attempt: %s cannot run it (%s)",
                     claim.id, self.server, reason, extra={"event": Ending.RELEASED, "kind": "catalogue"})
        return True

    def _stuck_here(self, prompt_id: str) -> None:
        """A prompt stuck in this server and nobody to restart it: out of service until its queue empties."""
        self.out_of_service.begin(prompt_id, time.monotonic())
        self.stuck.report(prompt_id)

    def _in_service(self) -> bool:
        """False while the server holds a stuck prompt; its /queue is read every few seconds meanwhile."""
        oos = self.out_of_service
        if not oos.active:
            return True
        now = time.monotonic()
        if not oos.due(now):
            return False
        prompt_id, since = oos.prompt_id, oos.since
        try:
            length: int | None = len(self.station.client.queue())
        except (ComfyError, deadline.DeadlineExceeded):
            length = None
        if not oos.seen(now, length):
            return False
        log.info("%s: back in service: its queue is empty again (prompt %s was stuck there for %.0f s)",
                 self.server, prompt_id, now - since, extra={"event": "in_service"})
        self.stuck.report("")
        return True

    def _server_free(self) -> bool:
        """The server answers and holds fewer than max_queue prompts of other clients."""
        try:
            entries = self.station.client.queue()
        except MalformedAnswer as exc:  # it answers, with a queue nobody can read: a person must look
            self._say_problem(f"its server answers GET /queue with a body that cannot be read ({exc.reason}); "
                              "no job is claimed for it until it answers well")
            return False
        except (ComfyError, deadline.DeadlineExceeded):  # unreachable, or a stop's grace has passed
            self.catalogue.server_down()  # it may come back restarted, with other nodes or models
            return False
        self._say_problem("")
        others = sum(1 for e in entries if not (e.client_id or "").startswith(CLIENT_PREFIX))
        return others < self.config.runner.max_queue

    def _say_problem(self, reason: str) -> None:
        """Report a change of the server's problem once (a log line, and ``on_problem``), not at every look."""
        if reason == self.problem:
            return
        self.problem = reason
        self.hooks.on_problem(reason)
        if reason:
            log.warning("%s: %s", self.server, reason, extra={"event": "server_malformed"})
        else:
            log.info("%s: its answers can be read again; jobs are claimed for it", self.server,
                     extra={"event": "server_malformed"})

    def _log(self, claim: Claim, o: Outcome) -> None:
        short = claim.id  # whole: ids that share their first 8 characters are common (11111111-…)
        event = {"event": o.state, "kind": o.kind}
        if o.state is Ending.DONE:
            files = ", ".join(f"{Path(f.name).name} {f.sha256[:16]}" for f in o.outputs[:4])
            more = ", …" if len(o.outputs) > 4 else ""
            how = ((" (adopted from its files in the server's output folder)" if o.adopted_from_disk
                    else " (adopted from /history)") if o.adopted else "")
            log.info("job %s: done on %s after %d attempt(s)%s, %d file(s): %s%s", short, self.server,
                     claim.attempt, how, len(o.outputs), files, more, extra=event)
        elif o.state is Ending.RETRY:
            log.info("job %s: attempt %d failed, %s; retry in %s", short, claim.attempt, bound(o.reason, 500),
                     _delay(o.delay_seconds), extra=event)
        elif o.state is Ending.DEAD:
            log.info("job %s: dead-lettered, %s", short, bound(o.reason, 500), extra=event)
        elif o.state is Ending.CANCELLED:
            log.info("job %s: cancelled on %s", short, self.server, extra=event)
        elif o.state is Ending.RELEASED:
            # o.reason already says "attempt not counted": in parentheses, it read "(…; attempt not counted)".
            log.info("job %s: released, %s", short, o.reason, extra=event)
        else:
            log.warning("job %s: attempt %d stopped without writing: %s", short, claim.attempt, o.reason,
                        extra=event)


def _delay(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"
