"""Step 1 of an attempt: catch up with a run of the job that an earlier attempt left on a server, following
it, adopting its history, or adopting its files from the server's output folder when the history died
with the server. A part of :class:`comfysup.runner.attempt.Attempt`, kept apart so each module stays
readable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from comfysup.comfy import ComfyClient, PromptRejected, ServerUnavailable
from comfysup.comfy.history import judge, prompt_number, status_of
from comfysup.queue.base import Claim, Queue
from comfysup.runner import outputs as job_outputs
from comfysup.runner.running import Run

if TYPE_CHECKING:
    from comfysup.runner.result import Posted
    from comfysup.runner.station import AttemptSettings, Station
    from comfysup.runner.trace import Trace

log = logging.getLogger("comfysup.runner")


class CatchingUp:
    """Step 1 of an attempt (DESIGN.md): catch up."""

    s: AttemptSettings
    station: Station
    claim: Claim
    queue: Queue
    trace: Trace
    wall: Callable[[], float]
    live: Run | None
    posted_in: Posted | None

    # -- 1. catch up ------------------------------------------------------------------------------------

    def _catch_up(self) -> Run | None:
        """A run of this job that an earlier attempt left on a server: follow or adopt it, or None to post.

        A prompt of ours still in a server's queue is followed whatever its number: it is live, and
        posting again would run the job twice. A history entry is adopted when its number is the one
        recorded; when the attempt that posted died before recording it, only a success is adopted.

        After a first attempt, every server this runner can reach is searched, not only the recorded one
        and its own: a runner killed between its POST and ``record_prompt`` left no record of where its
        prompt runs (``last_server`` is empty, or names an older attempt's server), and the prompt goes on
        running there. Posting it here would run the job on two servers at once (the chaos suite's
        kill-after-POST found exactly that).
        """
        first = self.claim.last_server is None and self.claim.attempt <= 1
        if first and self.posted_in is not None:
            return None  # the hand-off looked in this server's /history before it posted (its queue was empty)
        if first and not self.station.client.may_have_run(self.claim.id):
            return None  # the client knows every prompt this server was given, and this id is none of them
        # Nothing was posted for this job by this queue (or a retry of a dead job was asked for), but the
        # server may have run the id for another queue (restored from a backup, a second installation): its
        # /queue and /history are read before the first POST (two cheap calls), and what is there is followed
        # or adopted. A file left in its output folder is not adopted on a first look (no run to vouch for).
        places = self._places(first)
        gone: list[tuple[str, ComfyClient]] = []
        down: list[tuple[str, ComfyClient]] = []
        """Servers that answered and hold neither the prompt nor its history: restarted since, if it ran there."""
        for server, client, known in places:
            folder = self.station.output_dir(server, client)  # None for another machine's server of that name
            try:
                live = next((e for e in client.queue() if e.prompt_id == self.claim.id), None)
                history = None if live else client.history(self.claim.id, self.s.max_files_per_job)
            except ServerUnavailable:
                if folder is not None:
                    down.append((server, client))  # killed and not back yet: its folder may hold a whole run
                continue
            if live is not None:
                log.info("job %s attempt %d on %s: following prompt #%d left by an earlier attempt",
                         self.claim.id, self.claim.attempt, server, live.number)
                # Already running: its execution_start was sent before this socket existed.
                self.trace.phase("followed", self.wall())
                if live.running:
                    self.trace.phase("executing", self.wall())
                self.live = Run(client, server, live.number, started=live.running)
                self.queue.record_prompt(self.claim, server, live.number, client.url)
                return self.live
            if history is None:
                if folder is not None:
                    gone.append((server, client))
                continue
            if known is not None and prompt_number(history) != known:
                continue
            if known is None and status_of(history) != "success":
                continue
            judge(history)  # a run that ended in failure: that failure is this attempt's outcome
            log.info("job %s attempt %d on %s: adopting finished prompt #%s from /history",
                     self.claim.id, self.claim.attempt, server, prompt_number(history), extra={"event": "adopted"})
            self.trace.phase("adopted", self.wall())
            return Run(client, server, prompt_number(history), adopted_entry=history)
        return None if first else self._adopt_from_disk(gone, down)

    def _places(self, first: bool) -> list[tuple[str, ComfyClient, int | None]]:
        """Where to look, in order: (server name, its client, the prompt number recorded there or None).

        The recorded server is known by its URL too: a name means a server of this machine (two machines
        both have a gpu0), so an earlier attempt whose URL is none of this runner's servers ran elsewhere,
        on another machine's server (``[[servers]]`` managed elsewhere outlive a machine that died). That URL
        is asked first, with a short timeout; the prompt number recorded belongs to it, not to a server of that
        name here. Every other machine's server that an attempt named is asked too (newest first): one that
        never posted (refused, stopped, killed before its POST) must not hide an earlier run elsewhere.
        """
        if first:
            return [(self.s.server, self.station.client, None)]
        names = [self.claim.last_server, self.s.server, *(sorted(self.s.peers) if self.claim.attempt > 1 else [])]
        urls = self.queue.attempt_urls(self.claim.id, other_than=self.claim)
        # The claim's last_server and last_prompt_number are the newest recorded prompt's (cleared once an attempt
        # judged its run): that attempt's URL says on which machine.
        recorded = next((url for url, number in urls if number is not None), None)
        recorded_here = True
        out: list[tuple[str, ComfyClient, int | None]] = []
        for url in dict.fromkeys(url for url, _number in urls):
            elsewhere = self.station.client_elsewhere(url)
            if elsewhere is None:
                continue
            if url == recorded:
                recorded_here = False
                out.append((self.claim.last_server or elsewhere.url, elsewhere, self.claim.last_prompt_number))
            else:
                out.append((elsewhere.url, elsewhere, None))
        for server in dict.fromkeys(c for c in names if c):
            client = self.station.client_for(server)
            if client is not None:
                recorded = recorded_here and server == self.claim.last_server
                out.append((server, client, self.claim.last_prompt_number if recorded else None))
        return out

    def _adopt_from_disk(self, gone: list[tuple[str, ComfyClient]],
                         down: list[tuple[str, ComfyClient]]) -> Run | None:
        """A run whose history died with its server, adopted from the job's folder in that server's output
        folder when every output node left a complete file there (comfysup.runner.outputs). A folder that
        cannot vouch for a whole run is emptied, and the job runs again (a counted re-run).

        ``down``: servers that did not answer at all (killed, and not restarted yet: the chaos suite's K3 saw
        another slot's runner take the job in that moment and run it again). Their folders are adopted from
        too, but never emptied: a server that does not answer may still be writing."""
        clients = dict(gone) | dict(down)
        adopted = job_outputs.adopt(self.s.output_dirs, [s for s, _ in gone], self.claim.workflow, self.claim.id)
        if adopted is None and down:
            adopted = job_outputs.adopt(self.s.output_dirs, [s for s, _ in down], self.claim.workflow, self.claim.id,
                                        discard_unadoptable=False)
        if adopted is None:
            return None
        server, found = adopted
        log.info("job %s attempt %d on %s: adopting %d file(s) of a run whose history died with its server",
                 self.claim.id, self.claim.attempt, server, len(found), extra={"event": "adopted"})
        self.trace.phase("adopted", self.wall())
        return Run(clients[server], server, None, adopted_entry={}, from_disk=found)

    def _remove_job_folders(self) -> None:
        """The job's folder in every output folder this runner can see, once its end is recorded: saves list
        the folder to count, so it must not keep growing (best-effort)."""
        for server in self.s.output_dirs:
            job_outputs.discard(self.s.output_dirs, server, self.claim.id)

    def _post_prompt(self, claim: Claim, client_id: str) -> int:
        """POST ``claim``'s workflow (inputs delivered first); a refusal because an uploaded input vanished
        from the server is transient (comfysup.runner.inputs.InputDelivery.stale), any other 400 permanent."""
        try:
            return self.client.post_prompt(self._workflow_for(claim), claim.id, client_id, claim.extra_data)
        except PromptRejected as rejected:
            raise self.station.inputs.stale(rejected) or rejected from None

    def _workflow_for(self, claim: Claim) -> dict[str, Any]:
        """The workflow to post to this runner's server: with the job's own output folder when comfysup can
        see the server's output folder (for adoption from disk), else as it was submitted; its input files
        uploaded to the server first and named as ComfyUI expects (comfysup.runner.inputs)."""
        workflow = self.station.inputs.workflow(claim.workflow)
        if self.s.server not in self.s.output_dirs:
            return workflow
        return job_outputs.plan(workflow, claim.id).workflow
