"""The upload outbox's sender: one per machine, it uploads what this machine's runners staged for the bucket.

A job whose outputs are staged (comfysup.runner.objectstore: downloaded, hashed, fsynced in ``[store] dir``) is
recorded ``storing`` and its runner takes its next job at once. This uploader takes the machine's storing jobs
oldest first (comfysup.queue.uploads), sends each file to the bucket and has it confirmed, and makes the job
``done`` with the same outputs (sha256, ``s3://`` path) a direct upload gave. A bucket that does not answer
spends no attempt and dead-letters nothing: the uploader waits with full-jitter backoff (``[store]
upload_base_delay_seconds`` to ``upload_max_delay_seconds``) and tries the oldest job again, for as long as it
takes, or until a job has waited ``[store] upload_give_up_hours`` (then it is dead, with why). Its state is the
queue's rows and the staged files, so a restarted uploader resumes where the last one stopped.

Where it runs: ``comfysup run`` forks it as a sidecar (comfysup.supervisor.sidecars; restarted like the monitor,
its crash never touches a runner or the status page), ``comfysup work`` as a thread beside its webhooks. It
changes job states, so it is not part of the monitor (observability only reads); and it holds boto3's client
and threads, so it is not a thread of the supervisor, which forks runners for as long as it lives.
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from types import FrameType

from comfysup import stopsignals
from comfysup.backoff import RetryPolicy
from comfysup.config import Config
from comfysup.errors import ComfysupError, NotFound
from comfysup.queue import open_queue
from comfysup.queue.base import DONE, TERMINAL, Output, Queue, StagedJob, host_name
from comfysup.redact import bound
from comfysup.runner.objectstore import ObjectStore, result_store
from comfysup.storage import s3

log = logging.getLogger("comfysup.uploader")

IDLE_SECONDS = 0.5
"""How often an idle uploader looks for newly staged jobs (one indexed read of this machine's storing rows)."""
BATCH = 50
"""Storing jobs read at a time, oldest first."""
FINISH_SECONDS = 60.0
"""How long ``comfysup work`` keeps sending at its end while the bucket answers."""


class Step(Enum):
    """What the uploader does with the oldest storing job it holds (``UploadPlan.decide``)."""

    UPLOAD = "upload"  # send its files now
    GIVE_UP = "give_up"  # it waited longer than [store] upload_give_up_hours: dead-lettered
    WAIT = "wait"  # the bucket failed lately: wait for the backoff to pass


@dataclass
class UploadPlan:
    """The outbox's backoff as a pure state: how many tries in a row failed and when the next may go. One plan
    per machine, not per job: the bucket is down for every job at once, so one backoff spares it a storm."""

    base_delay_seconds: float
    max_delay_seconds: float
    give_up_seconds: float
    """0: never."""
    rand: Callable[[], float] = random.random
    failures: int = 0
    next_at: float = 0.0
    """Monotonic: no upload before it."""
    since: float | None = None
    """Monotonic: when the current run of failures began (None: the last try worked)."""
    policy: RetryPolicy = field(init=False)

    def __post_init__(self) -> None:
        self.policy = RetryPolicy(0, self.base_delay_seconds, self.max_delay_seconds, jitter=True)

    def decide(self, job: StagedJob, now: float, wall: float) -> Step:
        """``now`` monotonic, ``wall`` the epoch (``staged_at`` is one)."""
        if self.give_up_seconds and wall - job.staged_at > self.give_up_seconds:
            return Step.GIVE_UP
        return Step.UPLOAD if now >= self.next_at else Step.WAIT

    def failed(self, now: float) -> float:
        """A try failed: the wait before the next (full jitter), counted from ``now``."""
        self.failures += 1
        if self.since is None:
            self.since = now
        delay = self.policy.backoff(self.failures, self.rand)
        self.next_at = now + delay
        return delay

    def sent(self) -> bool:
        """A try worked: the next goes at once. True when it ended a run of failures (said once)."""
        ended = self.failures > 0
        self.failures, self.next_at, self.since = 0, 0.0, None
        return ended


def give_up_reason(job: StagedJob, hours: float) -> str:
    last = f", last: {job.reason}" if job.reason else ""
    return bound(f"could not store the outputs in the bucket for {hours:g} h ([store] upload_give_up_hours){last}",
                 1000)


class Uploader:
    """Sends this machine's staged outputs (see the module docstring). ``run_once`` is one pass; ``loop`` repeats
    it until ``stop`` is set."""

    def __init__(self, config: Config, queue: Queue, store: ObjectStore, machine: str | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        s = config.store
        self.queue = queue
        self.store = store
        self.machine = machine or host_name()
        self.clock, self.wall = clock, wall
        self.give_up_hours = s.upload_give_up_hours
        self.plan = UploadPlan(s.upload_base_delay_seconds, s.upload_max_delay_seconds, s.upload_give_up_hours * 3600)
        self.uploaded = 0
        """Jobs this uploader made done."""
        self.swept = False
        """The staging folders of ended jobs removed (once, at the first pass)."""
        self.stop: threading.Event | None = None
        """Set by ``loop``: a stop ends a pass between two jobs, not after the whole batch."""

    def run_once(self) -> float:
        """Every due job of this machine tried, oldest first, until one fails; the seconds to wait before the next
        pass (a short idle wait, or what is left of the backoff)."""
        if not self.swept:
            self.sweep()
        for job in self.queue.uploads.staged(self.machine, BATCH):
            if self.stop is not None and self.stop.is_set():
                break
            step = self.plan.decide(job, self.clock(), self.wall())
            if step is Step.WAIT:
                return max(0.0, self.plan.next_at - self.clock())
            if step is Step.GIVE_UP:
                self._give_up(job)
                continue
            missing = self._missing(job)
            if missing:
                self._give_up(job, missing)
                continue
            try:
                outputs = [self.store.upload(job.id, o) for o in job.outputs]
            except OSError as exc:
                self._failed(job, exc)
                return max(0.0, self.plan.next_at - self.clock())
            if self.plan.sent():
                log.info("uploads: the bucket answers again; sending what waited")
            self._stored(job, outputs)
        return IDLE_SECONDS

    def loop(self, stop: threading.Event) -> None:
        """Passes until ``stop``; a queue that does not answer is waited for (its rows are the outbox)."""
        self.stop = stop
        while not stop.is_set():
            try:
                wait = self.run_once()
            except ComfysupError as exc:
                log.warning("uploads: %s; trying again", exc)
                wait = 1.0
            stop.wait(max(wait, 0.05))

    def sweep(self) -> None:
        """The staging folders of done jobs whose every output is in the bucket removed: an uploader stopped
        between a job's done and the removal of its folder left a copy nothing needs. Only those: a folder of a job
        done before ``[store] url`` was set (the same ``dir``, its files the only copy) is never touched."""
        try:
            names = [entry.name for entry in os.scandir(self.store.root) if entry.is_dir(follow_symlinks=False)]
        except OSError:
            names = []
        for start in range(0, len(names), BATCH):
            done = [i for i, state in self.queue.reads.states(names[start:start + BATCH]).items() if state == DONE]
            for job in self.queue.reads.get_many(done) if done else []:
                if job.outputs and all(o.path.startswith(f"{s3.SCHEME}://") for o in job.outputs):
                    self.store.forget(job.id)
        self.swept = True

    def _stored(self, job: StagedJob, outputs: list[Output]) -> None:
        if self.queue.uploads.stored(job, outputs):
            self.uploaded += 1
            self.store.forget(job.id)
            return
        self._left(job)

    def _give_up(self, job: StagedJob, reason: str | None = None) -> None:
        why = reason or give_up_reason(job, self.give_up_hours)
        if self.queue.uploads.give_up(job, why):
            log.error("job %s: dead: %s", job.id, why)
            self.store.forget(job.id)
            return
        self._left(job)

    def _left(self, job: StagedJob) -> None:
        """The job is no longer storing these files (cancelled, or requeued by an operator): its staged copy goes,
        unless it was staged here again since (a new attempt's folder is its own to empty)."""
        again = [j for j in self.queue.uploads.staged(self.machine, BATCH) if j.id == job.id]
        try:
            ended = self.queue.reads.get(job.id).state in TERMINAL
        except NotFound:  # pruned since
            ended = True
        if ended and not again:
            self.store.forget(job.id)

    def _failed(self, job: StagedJob, exc: OSError) -> None:
        reason = bound(f"cannot store the output in the bucket: {exc.strerror or exc}", 1000)
        first = self.plan.since is None
        delay = self.plan.failed(self.clock())
        if first:
            log.warning("uploads: %s; the staged outputs wait (no attempt is spent), trying again with backoff",
                        reason)
        else:
            log.debug("uploads: still failing (%d tries): next in %.1f s", self.plan.failures, delay)
        self.queue.uploads.upload_failed(job, reason)

    @staticmethod
    def _missing(job: StagedJob) -> str | None:
        """Why the job can never be uploaded from here: a staged file is gone (its folder was removed by hand, or
        lost with a disk). Dead, saying so: ``comfysup retry`` runs it again."""
        for o in job.outputs:
            if not os.path.isfile(o.path):
                return (f"its staged output {o.name!r} is gone from {job.staged_in} on {job.machine}: "
                        "`comfysup retry` runs the job again")
        return None


def uploader_main(config: Config) -> int:
    """In the forked uploader child of ``comfysup run``: send until SIGTERM, then exit 0."""
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    stopsignals.install(on_term, (signal.SIGTERM,))
    stopsignals.install(signal.SIG_IGN, (signal.SIGINT,))  # Ctrl-C reaches the supervisor, which stops us in order
    store = result_store(config)
    if not isinstance(store, ObjectStore):
        return 0
    queue = open_queue(config, create=False)
    try:
        Uploader(config, queue, store).loop(stop)
    finally:
        queue.close()
    return 0


class UploadThread:
    """The uploader as a thread of a process that forks no more (``comfysup work``, after its runners are forked),
    on a queue connection of its own. ``finish`` stops it after one last pass: what is left waits in the staging
    folder for the next ``work`` or ``run`` of this machine."""

    def __init__(self, config: Config) -> None:
        store = result_store(config)
        self.queue: Queue | None = None
        self.uploader: Uploader | None = None
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if isinstance(store, ObjectStore):
            self.queue = open_queue(config, create=True)
            self.uploader = Uploader(config, self.queue, store)
            self.thread = threading.Thread(target=self.uploader.loop, args=(self.stop,), name="comfysup-uploads",
                                           daemon=True)

    def start(self) -> None:
        if self.thread is not None:
            self.thread.start()

    def finish(self, seconds: float = FINISH_SECONDS) -> None:
        """Stop the thread, then keep sending for at most ``seconds`` while the bucket answers and jobs of this
        machine wait (``work --until-empty`` sends the files of its last jobs before it returns)."""
        if self.thread is None or self.queue is None or self.uploader is None:
            return
        self.stop.set()
        self.thread.join()
        self.uploader.stop = None  # the last passes below run to their end
        try:
            deadline = time.monotonic() + seconds
            while (self.queue.uploads.staged(self.uploader.machine, 1) and self.uploader.plan.failures == 0
                   and time.monotonic() < deadline):
                self.uploader.run_once()
            left = len(self.queue.uploads.staged(self.uploader.machine))
            if left:
                log.warning("uploads: %d job(s) still wait in the staging folder for the bucket; the next "
                            "`comfysup work` or `run` on this machine sends them", left)
        except ComfysupError as exc:
            log.warning("uploads: %s", exc)
        finally:
            self.queue.close()
