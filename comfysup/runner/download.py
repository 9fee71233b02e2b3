"""The end of an attempt: interrupting its prompt (and reporting one that will not leave its server's queue),
and downloading its outputs into the result store. A part of :class:`comfysup.runner.attempt.Attempt`, kept
apart so each module stays readable; it uses the attempt's settings, claim, clocks and station.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from comfysup.comfy import ComfyError, PermanentError, deadline
from comfysup.comfy.history import output_files
from comfysup.comfyversion import has_jobs_api
from comfysup.queue.base import Output
from comfysup.runner import outputs as job_outputs
from comfysup.runner.running import AttemptPart, Run
from comfysup.runner.store import Incomplete, TooLarge, UnsafeName, is_disk_full, safe_relative
from comfysup.runner.stuck import report_stuck, stuck_reason

if TYPE_CHECKING:
    from comfysup.runner.trace import Trace

log = logging.getLogger("comfysup.runner")


class Ending(AttemptPart):
    """Steps 4 and 5 of an attempt (DESIGN.md): interrupt, download."""

    trace: Trace
    next_heartbeat: float

    def _checkpoints(self, run: Run, now: float) -> None:  # the attempt's
        raise NotImplementedError

    if TYPE_CHECKING:  # comfysup.runner.nextjob's (declared only for the type checker: no stub shadows them)
        def _withdraw_next(self, cancelled: bool, because: str = ..., kind: str = ...) -> None: ...

        def _renew_early(self, now: float) -> None: ...

    # -- 4. interrupt -----------------------------------------------------------------------------------

    def _interrupt(self, run: Run | None, renew: bool = True, prompt_id: str | None = None) -> str | None:
        """Interrupt our prompt (this job's, or ``prompt_id``), delete it from the queue, and wait until it
        has left /queue (renewing the lease on the way, unless the queue is what failed). Returns None, or
        why the prompt is stuck when it did not leave (see :meth:`_stuck`)."""
        if run is None:
            return None
        with deadline.suspended():  # it runs because a deadline passed, and must finish all the same
            return self._interrupt_now(run, renew, prompt_id)

    def _interrupt_now(self, run: Run, renew: bool, prompt_id: str | None) -> str | None:
        run.interrupt_asked = True
        target = prompt_id or self.claim.id
        until = self.clock() + self.s.leave_queue_seconds
        try:
            if not (has_jobs_api(run.client.version()) and run.client.cancel_job(target)):
                run.client.interrupt(target)  # ComfyUI 0.3.64: a prompt that started in between may be hit
                run.client.delete_queued([target])
        except ComfyError:
            return None
        while self.clock() < until:
            try:
                if not any(e.prompt_id == target for e in run.client.queue()):
                    return None
            except ComfyError:
                return None
            self._interrupt_alive(renew)
            time.sleep(0.05)
        return self._stuck(run, target, renew)

    def _interrupt_alive(self, renew: bool) -> None:
        """A sign of life and the leases, while an interrupt is waited out (up to leave_queue_seconds, then a
        stuck server's restart): this job's, and those of the jobs claimed early behind it, whose leases would
        otherwise run out meanwhile and hand them to another runner as expired, their attempt counted."""
        self.station.on_alive()
        if renew and self.clock() >= self.next_heartbeat:
            self.next_heartbeat = self.clock() + self.s.heartbeat_seconds
            self.queue.heartbeat(self.claim, self.s.lease_seconds)
            self._renew_early(self.clock())

    def _stuck(self, run: Run, target: str, renew: bool) -> str:
        """The prompt ignored /interrupt: reported, when in this runner's own server (comfysup.runner.stuck)."""
        log.error("job %s: prompt still in %s's queue %g s after /interrupt (a node that ignores the interrupt "
                  "flag)", target, run.server, self.s.leave_queue_seconds, extra={"event": "stuck"})
        own = run.client is self.client
        if own and target == self.claim.id:
            # A job queued behind it would never start, and a restart would destroy it: out of the server's
            # queue first, released without counting its attempt (it never ran; not "stuck" itself).
            self._withdraw_next(cancelled=False, because=f"a prompt stuck ahead of it ({target})", kind="withdrawn")
        restarted = report_stuck(self.station.stuck, target, own, lambda: self._interrupt_alive(renew), self.clock)
        return stuck_reason(run.server, self.s.leave_queue_seconds, restarted=restarted)

    # -- 5. download ------------------------------------------------------------------------------------

    def _download(self, run: Run, entry: dict[str, Any]) -> list[Output]:
        try:
            named = self._sources(run, entry)
        except (UnsafeName, TypeError) as exc:
            raise PermanentError(str(exc), "unsafe_output") from exc
        self.trace.phase("downloading", self.wall())
        # Only the attempt that holds the job may clear its folder: a fenced heartbeat now stops a stale
        # one (LeaseLost) before it touches files that the job's new owner may be writing.
        self.next_heartbeat = self.clock()
        self._checkpoints(run, self.clock())
        try:
            self.station.store.prepare(self.claim.id)
        except UnsafeName as exc:  # its folder is a symlink: nothing of it is touched, the job is dead
            raise PermanentError(str(exc), "unsafe_output") from exc
        except OSError as exc:  # the job's folder cannot be made: as transient as a file that cannot be written
            raise _store_failure(exc, self.claim.id) from exc
        outputs: list[Output] = []
        for relative, chunks in named:
            self._checkpoints(run, self.clock())
            left = self.s.max_job_bytes - sum(o.size for o in outputs)
            try:
                outputs.append(self.station.store.write(self.claim.id, relative, chunks(), limit_bytes=left,
                                                        limit_name="what is left of [store] max_job_mb"))
            except UnsafeName as exc:
                raise PermanentError(str(exc), "unsafe_output") from exc
            except TooLarge as exc:
                raise PermanentError(str(exc), "too_large") from exc
            except Incomplete as exc:
                raise ComfyError(str(exc), "download") from exc
            except OSError as exc:  # the store, or (adopted from disk) the server's folder since the scan
                raise _store_failure(exc, relative) from exc
        return outputs

    def _sources(self, run: Run, entry: dict[str, Any]) -> list[tuple[str, Callable[[], Iterable[bytes]]]]:
        """Each file's name in the store and where its bytes come from. Stored under the names the user chose:
        without the job's own folder that comfysup added to the prefixes.

        From the job's folder in the server's output folder when comfysup can see it (a server of this
        machine: ``comfysup run``'s own, a [[servers]] entry with an output_dir): a run adopted from disk, and
        every file the history names there, read from the disk rather than asked of the server. A /view is a
        round trip to a server that is running the next prompt by then (queued ahead), and ComfyUI answers
        it only when its executing thread lets go of the GIL: on a real ComfyUI it was 30% of a runner's wall
        time on trivial prompts. Anything else (a temp file, a file outside the job's folder, a server
        elsewhere, a file not found where it should be) comes through /view."""
        folder = self.station.output_dir(run.server, run.client)
        if run.from_disk is not None:
            return [(safe_relative(f.filename, f.subfolder),
                     partial(job_outputs.read, folder, self.claim.id, f.relative)) for f in run.from_disk]
        out: list[tuple[str, Callable[[], Iterable[bytes]]]] = []
        for f in output_files(entry):
            subfolder = f.get("subfolder") or ""
            relative = safe_relative(f["filename"], job_outputs.store_name(subfolder, self.claim.id))
            view = partial(run.client.view, f["filename"], subfolder, f["type"])
            within = job_outputs.in_job_folder(subfolder, self.claim.id) if f["type"] == "output" else None
            out.append((relative, view if folder is None or within is None else
                        partial(job_outputs.read_or, folder, self.claim.id, relative, view)))
        return out




def _store_failure(exc: OSError, where: str) -> ComfyError:
    """A transient failure of the result store (a full disk is freed, a mount comes back): retried, then
    dead with this reason. Never an exception out of the attempt: that crashes the runner, and a job
    whose every attempt crashes its runner would never end while it takes down one runner after another."""
    what = "the result store's disk is full" if is_disk_full(exc) else "cannot write to the result store"
    return ComfyError(f"{what}: {exc.strerror} ({where})", "store")
