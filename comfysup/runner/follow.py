"""Step 3 of an attempt (DESIGN.md): what following a prompt reads. The next message of its socket (reconnected
with the same client id when it drops), what each message means for the run, its history entry read from
/history, or made of its messages when the run was watched whole on one connection.

Plain functions of the attempt's :class:`Context` and the :class:`Run` followed; the loop that calls them, with
the heartbeat, the deadline and the early jobs between them, is the attempt's (``Attempt._follow``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from comfysup.comfy import ComfyError, MalformedAnswer, PermanentError, SocketLost, new_client_id, wire
from comfysup.comfy.history import judge, prompt_number
from comfysup.comfyversion import tells_every_output
from comfysup.runner.retry import execution_failure
from comfysup.runner.running import Context, Run

if TYPE_CHECKING:
    from comfysup.runner.nextjob import EarlyJobs

log = logging.getLogger("comfysup.runner")
READ_ON = "comfysup_read_on"
"""The key of a message kept for the next attempt (``Posted.events``) that names the connection it was read on."""
READ_AT = "comfysup_read_at"
"""The key of a message kept for the next attempt that says when it was read (wall clock): its trace times the
job's execution from there, not from when the message is handed on (after the attempt ahead of it ended)."""
HISTORY_AFTER_SUCCESS_SECONDS = 0.05


def receive(ctx: Context, run: Run, replay: list[dict[str, Any]], wait: float) -> dict[str, Any] | None:
    """The next message of the run (first those ``replay`` holds: read by the attempt that queued this job), or
    None after ``wait`` seconds; a dropped socket is reconnected with the same client id, and said so by a
    ``comfysup_reconnected`` message (the caller then reads /history: nothing is replayed to it)."""
    if replay:
        return replay.pop(0)
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
        ctx.trace.reconnected(ctx.wall(), ok)
        how = "reconnected with the same client id" if ok else "could not reconnect yet, trying again"
        log.warning("job %s attempt %d on %s: the WebSocket dropped (%s); %s", ctx.claim.id, ctx.claim.attempt,
                    run.server, lost.reason, how, extra={"event": "reconnected" if ok else "socket_lost"})
        if not ok:
            time.sleep(min(wait, 0.2))
        return {"type": "comfysup_reconnected", "data": {"prompt_id": ctx.claim.id}}



def on_message(ctx: Context, run: Run, message: dict[str, Any], early: EarlyJobs) -> float | None:
    """Handle one event of ``run`` (one of the job queued behind it is kept for that job's attempt, in ``early``);
    returns in how many seconds /history should be read (None: no change).

    ``execution_success`` comes before ComfyUI writes the history, ``executing`` with node None right
    after it: reading /history at the first would mostly find nothing and cost two more calls (history
    and queue), so it is read at the second, or HISTORY_AFTER_SUCCESS_SECONDS after the first at most.
    """
    kind = message.get("type")
    data = message.get("data") or {}
    if kind == "comfysup_reconnected":
        return 0.0
    if kind == "preview":  # of the prompt executing now: this run's between its start and its end
        if run.started and not run.end_seen and data.get("prompt_id") in (None, ctx.claim.id):
            node = data.get("node_id") or (ctx.trace.current.id if ctx.trace.current is not None else None)
            run.preview = (node, data["content_type"], data["image"])
        return None
    if kind == "status":
        remaining = ((data.get("status") or {}).get("exec_info") or {}).get("queue_remaining")
        run.queue_remaining = remaining if isinstance(remaining, int) else None
        return None
    # The connection it was read on: the attempt that posted this job read it (tagged then), or this one now.
    connection = message.pop(READ_ON, None) or (run.stream.connection if run.stream is not None else 0)
    read_at = message.pop(READ_AT, None) or ctx.wall()
    if data.get("prompt_id") != ctx.claim.id:
        posted = early.posted_out
        if posted is not None and data.get("prompt_id") == posted.claim_id:
            # Queued ahead, it runs now: its attempt gets what was read of it here.
            early.posted_out = replace(posted, started=posted.started or kind == "execution_start",
                                       events=(*posted.events, {**message, READ_ON: connection, READ_AT: read_at}))
        return None
    if kind == "execution_start":
        run.started = True
        run.watched_on = connection
        run.outputs.clear()
    if not run.started:
        return None
    ctx.trace.on_event(kind, data, read_at)
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



def poll(ctx: Context, run: Run, early: EarlyJobs) -> dict[str, Any] | None:
    """This run's history entry when it succeeded; None while it runs. Raises on failure or loss."""
    entry = own_entry(ctx, run)
    if entry is not None:
        return judge(entry)
    if any(e.prompt_id == ctx.claim.id for e in run.client.queue()):
        return None
    # Not in the queue: it finished between the two reads (the history is written before the prompt
    # leaves the queue), or the server lost it.
    entry = own_entry(ctx, run)
    if entry is not None:
        return judge(entry)
    # The server answered: this is certain, not a reason to wait for it to come back.
    early.lost(run)
    raise ComfyError("the prompt is gone from the server's queue without a history entry "
                     "(the ComfyUI server restarted)", "server_died")

def watched_whole(run: Run) -> bool:
    """Every message of the run since its execution_start was read on one connection, still the one that
    reads, of a server whose messages carry every output (comfysup.comfyversion.tells_every_output)."""
    return (run.watched_on > 0 and run.stream is not None and run.stream.connection == run.watched_on
            and tells_every_output(run.client.version()))

def entry_from_socket(ctx: Context, run: Run) -> dict[str, Any]:
    """The history entry of a run watched whole on the socket (see ``Run.watched_on``), made of its messages and
    checked as a /history answer is (at every level, at most max_files_per_job files): one GET less per
    job, and the round trip that came with it on a server that has the next prompt to run."""
    body = {ctx.claim.id: {"prompt": [run.number if run.number is not None else -1, ctx.claim.id],
                            "status": {"status_str": "success", "completed": True, "messages": []},
                            "outputs": run.outputs}}
    try:
        entry = wire.history_entry(body, ctx.claim.id, max_files=ctx.s.max_files_per_job,
                                   where="run (its executed messages)")
    except wire.Malformed as exc:
        raise MalformedAnswer(f"server sent a malformed {exc}") from None
    assert entry is not None
    return judge(entry)

def own_entry(ctx: Context, run: Run) -> dict[str, Any] | None:
    entry = run.client.history(ctx.claim.id, ctx.s.max_files_per_job)
    if entry is not None and (run.number is None or prompt_number(entry) == run.number):
        ctx.trace.from_history(entry, ctx.wall())  # cached nodes, a failure's node: for the API
        return entry
    return None
