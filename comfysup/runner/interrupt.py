"""Step 4 of an attempt (docs/design.md): interrupt its prompt, take it out of the server's queue, and wait until it
has left; a prompt that will not leave is reported (comfysup.runner.stuck) and its server restarted.

An :class:`Interrupter` is made once per attempt. What it needs besides the attempt's :class:`Context` is given to
it: the attempt's heartbeat clock and hold on its leases, how to renew the leases of the jobs the attempt took ahead
(``renew_ahead``) and how to take back the one queued behind a stuck prompt (``withdraw_next``): both are the
attempt's :class:`comfysup.runner.ahead.AheadJobs`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from comfysup.comfy import ComfyError, deadline
from comfysup.comfyversion import has_jobs_api
from comfysup.runner.hold import Keeper
from comfysup.runner.running import Context, Heartbeat, Run
from comfysup.runner.stuck import report_stuck, stuck_reason

log = logging.getLogger("comfysup.runner")


class Interrupter:
    """Interrupts the prompts of one attempt (its own, or a job's it took ahead) and waits for them to leave."""

    def __init__(self, ctx: Context, heartbeat: Heartbeat, keeper: Keeper, renew_ahead: Callable[[float], None],
                 withdraw_next: Callable[..., None]) -> None:
        self.ctx = ctx
        self.heartbeat = heartbeat
        self.keeper = keeper
        """The attempt's hold on its leases while the queue does not answer (comfysup.runner.hold)."""
        self.renew_ahead = renew_ahead
        """Renews the leases of the jobs taken ahead (``AheadJobs.renew``), given the clock's now."""
        self.withdraw_next = withdraw_next
        """Takes the job queued ahead behind this one out of the server's queue (``AheadJobs.withdraw_next``)."""

    def interrupt(self, run: Run | None, renew: bool = True, prompt_id: str | None = None) -> str | None:
        """Interrupt our prompt (this job's, or ``prompt_id``), delete it from the queue, and wait until it
        has left /queue (renewing the lease on the way, unless the queue is what failed). Returns None, or
        why the prompt is stuck when it did not leave (see :meth:`_stuck`)."""
        if run is None:
            return None
        with deadline.suspended():  # it runs because a deadline passed, and must finish all the same
            return self._interrupt_now(run, renew, prompt_id)

    def _interrupt_now(self, run: Run, renew: bool, prompt_id: str | None) -> str | None:
        ctx = self.ctx
        run.m.interrupting()
        target = prompt_id or ctx.claim.id
        until = ctx.clock() + ctx.s.leave_queue_seconds
        try:
            if not (has_jobs_api(run.client.version()) and run.client.cancel_job(target)):
                run.client.interrupt(target)  # ComfyUI 0.3.64: a prompt that started in between may be hit
                run.client.delete_queued([target])
        except ComfyError:
            return None
        while ctx.clock() < until:
            try:
                if not any(e.prompt_id == target for e in run.client.queue()):
                    return None
            except ComfyError:
                return None
            self._alive(renew)
            time.sleep(0.05)
        return self._stuck(run, target, renew)

    def _alive(self, renew: bool) -> None:
        """A sign of life and the leases, while an interrupt is waited out (up to leave_queue_seconds, then a
        stuck server's restart): this job's, and those of the jobs taken ahead behind it, whose leases would
        otherwise run out meanwhile and hand them to another runner as expired, their attempt counted."""
        ctx = self.ctx
        ctx.station.on_alive()
        if renew and self.heartbeat.due(ctx.clock()):
            self.keeper.renew(self._renew_all)

    def _renew_all(self) -> None:
        ctx = self.ctx
        ctx.queue.leases.heartbeat(ctx.claim, ctx.s.lease_seconds)
        self.renew_ahead(ctx.clock())

    def _stuck(self, run: Run, target: str, renew: bool) -> str:
        """The prompt ignored /interrupt: reported, when in this runner's own server (comfysup.runner.stuck)."""
        ctx = self.ctx
        log.error("job %s: prompt still in %s's queue %g s after /interrupt (a node that ignores the interrupt "
                  "flag)", target, run.server, ctx.s.leave_queue_seconds, extra={"event": "stuck"})
        own = run.client is ctx.client
        if own and target == ctx.claim.id:
            # A job queued behind it would never start, and a restart would destroy it: out of the server's
            # queue first, released without counting its attempt (it never ran; not "stuck" itself).
            self.withdraw_next(cancelled=False, because=f"a prompt stuck ahead of it ({target})", kind="withdrawn")
        restarted = report_stuck(ctx.station.stuck, target, own, lambda: self._alive(renew), ctx.clock)
        return stuck_reason(run.server, ctx.s.leave_queue_seconds, restarted=restarted)
