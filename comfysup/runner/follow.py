"""Step 3 of an attempt (docs/design.md): what following a prompt reads. The next message of its socket (reconnected
with the same client id when it drops), what each message means for the run, its history entry read from
/history, or made of its messages when the run was watched whole on one connection.

Plain functions of the attempt's :class:`Context` and the :class:`Run` followed: what a message means is the run's
pure machine's to say (comfysup.runner.machine), what it asks is done here; the loop that calls them, with the
heartbeat, the deadline and the jobs taken ahead between them, is comfysup.runner.driver's.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from comfysup.comfy import ComfyError, MalformedAnswer, PermanentError, SocketLost, new_client_id, wire
from comfysup.comfy.history import judge, prompt_number
from comfysup.runner.machine import Action, Fail, KeepPreview, Message, OtherPrompt, PollIn, Reconnected, TraceIt
from comfysup.runner.running import Context, Run

if TYPE_CHECKING:
    from comfysup.runner.ahead import AheadJobs

log = logging.getLogger("comfysup.runner")
READ_ON = "comfysup_read_on"
"""The key of a message kept for the next attempt (``Ahead.events``) that names the connection it was read on."""
READ_AT = "comfysup_read_at"
"""The key of a message kept for the next attempt that says when it was read (wall clock): its trace times the
job's execution from there, not from when the message is handed on (after the attempt ahead of it ended)."""
RECONNECTED = Reconnected()


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



def on_message(ctx: Context, run: Run, message: dict[str, Any], ahead: AheadJobs) -> float | None:
    """Feed one message to the run's machine and carry out what it says (a message of the job taken ahead is kept
    for that job's attempt, in ``ahead``); returns in how many seconds /history should be read (None: no
    change). A failed run raises its ComfyError."""
    kind = message.get("type")
    if kind == "comfysup_reconnected":
        run.m.step(RECONNECTED)
        return 0.0
    data = message.get("data") or {}
    # The connection it was read on: the attempt that posted this job read it (tagged then), or this one now.
    connection = message.pop(READ_ON, None) or (run.stream.connection if run.stream is not None else 0)
    read_at = message.pop(READ_AT, None)
    poll_in = None
    for act in run.m.step(Message(kind, data, connection)):
        if type(act) is PollIn:
            poll_in = act.seconds
        elif type(act) is TraceIt:
            ctx.trace.on_event(kind, data, read_at or ctx.wall())
        else:
            _carry_out(ctx, run, act, message, connection, read_at or ctx.wall(), ahead)
    return poll_in


def _carry_out(ctx: Context, run: Run, act: Action, message: dict[str, Any], connection: int, read_at: float,
               ahead: AheadJobs) -> None:
    """What the machine asks of a message besides its trace and the next /history read (those are the hot path)."""
    data = message.get("data") or {}
    if type(act) is KeepPreview:
        node = data.get("node_id") or (ctx.trace.current.id if ctx.trace.current is not None else None)
        run.preview = (node, data["content_type"], data["image"])
    elif type(act) is OtherPrompt:
        ahead.keep_message(data["prompt_id"], {**message, READ_ON: connection, READ_AT: read_at}, act.started)
    elif type(act) is Fail:
        raise ComfyError(act.reason, act.kind) if act.transient else PermanentError(act.reason, act.kind)


def poll(ctx: Context, run: Run, ahead: AheadJobs) -> dict[str, Any] | None:
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
    ahead.lost(run)
    raise ComfyError("the prompt is gone from the server's queue without a history entry "
                     "(the ComfyUI server restarted)", "server_died")

def entry_from_socket(ctx: Context, run: Run) -> dict[str, Any]:
    """The history entry of a run watched whole on the socket (see ``RunMachine.watched_on``), made of its messages and
    checked as a /history answer is (at every level, at most max_files_per_job files): one GET less per
    job, and the round trip that came with it on a server that has the next prompt to run."""
    body = {ctx.claim.id: {"prompt": [run.number if run.number is not None else -1, ctx.claim.id],
                            "status": {"status_str": "success", "completed": True, "messages": []},
                            "outputs": run.m.outputs}}
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
