"""Step 1 of an attempt (docs/design.md): catch up with a run of the job that an earlier attempt left on a server,
following it, adopting its history, or adopting its files from the server's output folder when the history
died with the server. Plain functions of the attempt's :class:`Context` and of this job's post, when the
previous attempt took it ahead and posted it (``taken``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from comfysup.comfy import ComfyClient, ServerUnavailable
from comfysup.comfy.history import judge, prompt_number, status_of
from comfysup.runner import outputs as job_outputs
from comfysup.runner.running import Context, Run

if TYPE_CHECKING:
    from comfysup.runner.result import Ahead

log = logging.getLogger("comfysup.runner")


def catch_up(ctx: Context, taken: Ahead | None) -> tuple[Run | None, bool]:
    """A run of this job that an earlier attempt left on a server, to follow or adopt (None: post the job), and
    whether it is one to follow (still in a server's queue: the attempt records where, with its number).

    A prompt of ours still in a server's queue is followed whatever its number: it is live, and
    posting again would run the job twice. A history entry is adopted when its number is the one
    recorded; when the attempt that posted died before recording it, only a success is adopted.

    After a first attempt, every server this runner can reach is searched, not only the recorded one
    and its own: a runner killed between its POST and ``record_prompt`` left no record of where its
    prompt runs (``last_server`` is empty, or names an older attempt's server), and the prompt goes on
    running there. Posting it here would run the job on two servers at once (the chaos suite's
    kill-after-POST found exactly that).
    """
    first = ctx.claim.last_server is None and ctx.claim.attempt <= 1
    if first and taken is not None:
        return None, False  # the hand-off looked in this server's /history before it posted (its queue was empty)
    if first and not ctx.station.client.may_have_run(ctx.claim.id):
        return None, False  # the client knows every prompt this server was given, and this id is none of them
    # Nothing was posted for this job by this queue (or a retry of a dead job was asked for), but the
    # server may have run the id for another queue (restored from a backup, a second installation): its
    # /queue and /history are read before the first POST (two cheap calls), and what is there is followed
    # or adopted. A file left in its output folder is not adopted on a first look (no run to vouch for).
    gone: list[tuple[str, ComfyClient]] = []
    down: list[tuple[str, ComfyClient]] = []
    """Servers that answered and hold neither the prompt nor its history (restarted since, if it ran there), and
    servers of this machine that did not answer at all."""
    for server, client, known in _places(ctx, first):
        found = _look(ctx, server, client, known, gone, down)
        if found is not None:
            return found
    return (None if first else _adopt_from_disk(ctx, gone, down)), False


def _look(ctx: Context, server: str, client: ComfyClient, known: int | None, gone: list[tuple[str, ComfyClient]],
          down: list[tuple[str, ComfyClient]]) -> tuple[Run, bool] | None:
    """A run of this job on ``server`` (``known``: the prompt number recorded there), to follow or adopt; None:
    none there (the server joins ``gone`` or ``down`` when comfysup can see its output folder)."""
    folder = ctx.station.output_dir(server, client)  # None for another machine's server of that name
    try:
        live = next((e for e in client.queue() if e.prompt_id == ctx.claim.id), None)
        history = None if live else client.history(ctx.claim.id, ctx.s.max_files_per_job)
    except ServerUnavailable:
        if folder is not None:
            down.append((server, client))  # killed and not back yet: its folder may hold a whole run
        return None
    if live is not None:
        log.info("job %s attempt %d on %s: following prompt #%d left by an earlier attempt",
                 ctx.claim.id, ctx.claim.attempt, server, live.number)
        # Already running: its execution_start was sent before this socket existed.
        ctx.trace.phase("followed", ctx.wall())
        if live.running:
            ctx.trace.phase("executing", ctx.wall())
        return Run(client, server, live.number, started=live.running), True
    if history is None:
        if folder is not None:
            gone.append((server, client))
        return None
    if (known is not None and prompt_number(history) != known) or (known is None and status_of(history) != "success"):
        return None
    ctx.trace.from_history(history, ctx.wall())
    judge(history)  # a run that ended in failure: that failure is this attempt's outcome
    log.info("job %s attempt %d on %s: adopting finished prompt #%s from /history",
             ctx.claim.id, ctx.claim.attempt, server, prompt_number(history), extra={"event": "adopted"})
    ctx.trace.phase("adopted", ctx.wall())
    return Run(client, server, prompt_number(history), adopted_entry=history), False


def _places(ctx: Context, first: bool) -> list[tuple[str, ComfyClient, int | None]]:
    """Where to look, in order: (server name, its client, the prompt number recorded there or None).

    The recorded server is known by its URL too: a name means a server of this machine (two machines
    both have a gpu0), so an earlier attempt whose URL is none of this runner's servers ran elsewhere,
    on another machine's server (``[[servers]]`` managed elsewhere outlive a machine that died). That URL
    is asked first, with a short timeout; the prompt number recorded belongs to it, not to a server of that
    name here. Every other machine's server that an attempt named is asked too (newest first): one that
    never posted (refused, stopped, killed before its POST) must not hide an earlier run elsewhere.
    """
    if first:
        return [(ctx.s.server, ctx.station.client, None)]
    out, recorded_here = _elsewhere(ctx)
    names = [ctx.claim.last_server, ctx.s.server, *(sorted(ctx.s.peers) if ctx.claim.attempt > 1 else [])]
    for server in dict.fromkeys(c for c in names if c):
        client = ctx.station.client_for(server)
        if client is not None:
            recorded = recorded_here and server == ctx.claim.last_server
            out.append((server, client, ctx.claim.last_prompt_number if recorded else None))
    return out


def _elsewhere(ctx: Context) -> tuple[list[tuple[str, ComfyClient, int | None]], bool]:
    """The other machines' servers an attempt of this job named (newest first), and whether the recorded prompt
    is on one of this machine's servers (False: on one of those)."""
    urls = ctx.queue.leases.attempt_urls(ctx.claim.id, other_than=ctx.claim)
    # The claim's last_server and last_prompt_number are the newest recorded prompt's (cleared once an attempt
    # judged its run): that attempt's URL says on which machine.
    recorded = next((url for url, number in urls if number is not None), None)
    recorded_here = True
    out: list[tuple[str, ComfyClient, int | None]] = []
    for url in dict.fromkeys(url for url, _number in urls):
        elsewhere = ctx.station.client_elsewhere(url)
        if elsewhere is None:
            continue
        if url == recorded:
            recorded_here = False
            out.append((ctx.claim.last_server or elsewhere.url, elsewhere, ctx.claim.last_prompt_number))
        else:
            out.append((elsewhere.url, elsewhere, None))
    return out, recorded_here


def _adopt_from_disk(ctx: Context, gone: list[tuple[str, ComfyClient]],
                    down: list[tuple[str, ComfyClient]]) -> Run | None:
    """A run whose history died with its server, adopted from the job's folder in that server's output
    folder when every output node left a complete file there (comfysup.runner.outputs). A folder that
    cannot vouch for a whole run is emptied, and the job runs again (a counted re-run).

    ``down``: servers that did not answer at all (killed, and not restarted yet: the chaos suite's K3 saw
    another slot's runner take the job in that moment and run it again). Their folders are adopted from
    too, but never emptied: a server that does not answer may still be writing."""
    clients = dict(gone) | dict(down)
    adopted = job_outputs.adopt(ctx.s.output_dirs, [s for s, _ in gone], ctx.claim.workflow, ctx.claim.id)
    if adopted is None and down:
        adopted = job_outputs.adopt(ctx.s.output_dirs, [s for s, _ in down], ctx.claim.workflow, ctx.claim.id,
                                    discard_unadoptable=False)
    if adopted is None:
        return None
    server, found = adopted
    log.info("job %s attempt %d on %s: adopting %d file(s) of a run whose history died with its server",
             ctx.claim.id, ctx.claim.attempt, server, len(found), extra={"event": "adopted"})
    ctx.trace.phase("adopted", ctx.wall())
    return Run(clients[server], server, None, adopted_entry={}, from_disk=found)
