"""Step 6 of an attempt (docs/design.md): its outcome, its reason class and its trace, recorded in one fenced write
(with the claim of the runner's next job, in one transaction, when the runner goes on); and, while it runs, its
live progress and newest preview, written at most so often.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from comfysup.errors import QueueUnavailable
from comfysup.queue.base import Claim
from comfysup.queue.roles import Leases
from comfysup.redact import Redactor
from comfysup.runner.ahead import AheadJobs
from comfysup.runner.hold import Keeper
from comfysup.runner.result import Ending, Outcome
from comfysup.runner.running import Context, Run

ERROR_CHARS = {"message": 2000, "traceback": 8000}
"""What of ComfyUI's exception message and traceback an attempt's trace keeps (other fields: 200 characters)."""
PROGRESS_WRITE_SECONDS = 1.0
"""At most one progress write per second: a sampler's steps come faster than a queue row should change."""

_Write = Callable[[Leases, Claim, Outcome, dict[str, Any]], object]
_WRITES: dict[Ending, _Write] = {
    Ending.RETRY: lambda leases, c, o, trace: leases.retry_later(c, time.time() + o.delay_seconds, o.reason,
                                                                 kind=o.kind, trace=trace),
    Ending.DEAD: lambda leases, c, o, trace: leases.dead(c, o.reason, kind=o.kind, trace=trace),
    Ending.CANCELLED: lambda leases, c, o, trace: leases.cancelled(c, o.reason, trace=trace),
    Ending.RELEASED: lambda leases, c, o, trace: leases.release(c, o.reason, count_attempt=False, kind=o.kind,
                                                                trace=trace),
}
"""How each outcome but DONE is written (LOST is never: it writes nothing)."""


def record(ctx: Context, outcome: Outcome, ahead: AheadJobs, redact: Redactor) -> None:
    """The outcome, its reason class and the attempt's trace, in one fenced write."""
    ctx.trace.phase("recorded", ctx.wall())
    trace = ctx.trace.as_dict()
    if "error" in trace:  # ComfyUI's text, as the reason: redacted first, then cut
        trace["error"] = {k: redact(v, ERROR_CHARS.get(k, 200)) if isinstance(v, str) else v
                          for k, v in trace["error"].items()}
    if outcome.state is Ending.DONE:
        _record_done(ctx, outcome, ahead, trace)
    else:
        _WRITES[outcome.state](ctx.queue.leases, ctx.claim, outcome, trace)


def _record_done(ctx: Context, outcome: Outcome, ahead: AheadJobs, trace: dict[str, Any]) -> None:
    """Done, with the claim of the runner's next job when none was taken ahead yet and the runner goes on, or of
    the job to queue behind the next one (``AheadJobs.behind``); with the next job's start, when it waits shown as
    posted and its start was read here, and its number, when the attempt before posted it after its own done."""
    ask = ahead.asks.hand_off
    args = ask(ctx.claim, outcome) if ask is not None and ahead.next is None else None
    if args is None and ahead.may_take_behind_next():
        args = ahead.behind
    started = ahead.started_ahead()  # the job queued behind this one executes: said in this end
    prompt = ahead.unrecorded_prompt()  # and its number, when it was posted after the done before this one
    staged_in = ctx.station.store.staged_in(ctx.claim.id)  # a bucket's: storing, until its uploader has them
    if args is None:
        held = ctx.queue.leases.complete(ctx.claim, outcome.outputs, trace=trace, started=started,
                                         staged_in=staged_in, prompt=prompt)
    else:
        claimed_at, renewed_at = ctx.wall(), ctx.clock()
        claim, held = ctx.queue.leases.complete_and_claim(
            ctx.claim, outcome.outputs, args.owner, args.server, args.lease_seconds, trace=trace,
            prefer_model=args.prefer_model, max_wait_seconds=args.max_wait_seconds, catalogue=args.catalogue,
            url=ctx.s.url, staged_in=staged_in, started=started, prompt=prompt)
        ahead.take_claimed(claim, claimed_at, renewed_at)
    if started is not None:
        ahead.start_recorded()
    if prompt is not None:
        ahead.prompt_recorded(held)


class Progress:
    """The attempt's live progress and newest preview, written when they moved and no oftener than allowed."""

    def __init__(self, ctx: Context, keeper: Keeper) -> None:
        self.ctx = ctx
        self.keeper = keeper
        """Its hold on the leases: while renewals fail, nothing here is written (it can wait; renewals cannot)."""
        self.progress_at = ctx.clock()
        """The first progress is written a second into the attempt: a job that ends sooner costs no write for it
        (its trace, recorded with its end, has the whole of it)."""
        self.preview_at = float("-inf")
        """When the last preview was written ([runner] preview_seconds apart)."""

    def write(self, run: Run | None) -> None:
        """The live progress, when it moved and a second has passed since the last write (fenced); the newest
        preview, at most every [runner] preview_seconds (fenced, not durable)."""
        if self.keeper.failing:
            return
        try:
            self._write(run)
        except QueueUnavailable:
            return  # written when it next moves; the heartbeat finds out whether the queue is gone

    def _write(self, run: Run | None) -> None:
        ctx = self.ctx
        now = ctx.clock()
        if run is not None and run.preview is not None and now - self.preview_at >= ctx.s.preview_seconds:
            (node, content_type, image), run.preview = run.preview, None
            self.preview_at = now
            ctx.queue.previews.set_preview(ctx.claim, node, content_type, image)
        if not ctx.trace.changed or now - self.progress_at < PROGRESS_WRITE_SECONDS:
            return
        progress = ctx.trace.progress()
        ctx.trace.changed = False
        if progress is not None:
            self.progress_at = now
            ctx.queue.leases.set_progress(ctx.claim, progress)
