"""What a client knows of the prompts its server was given: the queue's entries as read, and the numbers
ComfyUI handed out, so that a job's first POST need not ask /history first (see ``KnownRuns``)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class QueueEntry:
    number: int
    prompt_id: str
    client_id: str | None
    running: bool


LOOK_ENTRIES = 256
"""A server's history is read whole (to learn every id it ran) only when it holds at most this many entries;
a longer one is asked per job, by GET /history/{id}."""
TRUST_SECONDS = 1.0
"""How long after the look, or after this client's last POST, no other client is taken to have posted: a job
posted later is looked up first (GET /history/{id}), as every job was before. Another client's post is seen
only by the number of this client's next one; within this second it may go unseen, as between a look-up and
its POST. A stream of short prompts, where a look-up per job costs a tenth of the runner's time, posts far
more often than this."""
KNOWN_IDS = 20_000
"""Ids remembered at most (the oldest forgotten first): ComfyUI keeps the last 10,000 prompts' history."""


@dataclass
class KnownRuns:
    """Which prompt ids a server holds (queued, running) or ran (its history), as this client knows without
    asking it per job (:meth:`ComfyClient.may_have_run`).

    ``unread``: not looked at yet, or the server may have restarted since (its numbers began again, a
    connection to it failed), or the first post came too long after the look to count from. ``known``: ``ids``
    holds every prompt the server was given up to this client's last post: what GET /queue and /history showed,
    then this client's own posts, each numbered right after the one before (ComfyUI gives every POST /prompt
    the next number, a refused one too, so a number skipped is another client's post). ``unknown``: another
    client posted in between, the history was too long to read whole, or an answer could not be read: every id
    is asked of the server, as before, until the server may have restarted."""

    state: str = "unread"
    ids: dict[str, None] = field(default_factory=dict)
    """Ordered, so the oldest are forgotten first beyond KNOWN_IDS."""
    last: int | None = None
    """The number this client's newest POST /prompt took (None: none since the look). The numbers in the
    server's queue and history are not counted from: a client may give its own ("number" in the body), which
    the server's counter does not follow, and such a client is not seen (ComfyUI's own front end gives none)."""
    since: float = 0.0
    """When (monotonic) the look was made or this client last posted."""

    def trusted(self, now: float) -> bool:
        """Known, and recent enough that no other client's post can have gone unseen for long."""
        return self.state == "known" and now - self.since <= TRUST_SECONDS

    def look(self, queue: list[QueueEntry], history: dict[str, int] | None, now: float) -> None:
        """What GET /queue and GET /history?max_items=… answered (``history`` None: too long to read whole)."""
        self.ids = {}
        if history is None:
            self.state = "unknown"
            return
        for prompt_id in [*(e.prompt_id for e in queue), *history]:
            self._remember(prompt_id)
        self.state, self.last, self.since = "known", None, now

    def posted(self, prompt_id: str, number: int | None, now: float) -> None:
        """This client's POST /prompt of ``prompt_id`` took ``number``; None: it was refused (a 400), which
        took the next number all the same. Only a number that follows on renews the trust: a refusal proves
        nothing of other clients, and the first post after a look is taken as the start of the count only
        within TRUST_SECONDS of the look (else the server is looked at again)."""
        if number is None:
            if self.last is not None:
                self.last += 1
            return
        taken = abs(number)
        if self.last is not None and taken <= self.last:
            self.forget()  # numbers began again: the server restarted, its runs are gone
        elif self.state == "known" and self.last is None and now - self.since > TRUST_SECONDS:
            self.forget()  # too long since the look for this number to start the count from
        elif self.state == "known" and self.last is not None and taken != self.last + 1:
            self.state, self.ids = "unknown", {}  # another client posted in between
        if self.state == "known":
            self._remember(prompt_id)
            self.since = now
        self.last = taken

    def forget(self) -> None:
        """Look at the server again before trusting the count (it restarted, or may have: a connection failed)."""
        self.state, self.ids = "unread", {}

    def _remember(self, prompt_id: str) -> None:
        self.ids[prompt_id] = None
        if len(self.ids) > KNOWN_IDS:
            del self.ids[next(iter(self.ids))]
