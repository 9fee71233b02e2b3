"""A prompt's node time, kept the way a benchmark reads it: a prompt given T ms of nodes ends T ms after its
execution_start, the fake's own bookkeeping included.

The time is kept against a deadline, execution_start + every node time given so far, rather than slept node by
node: each wake-up of the event loop comes late (epoll counts whole milliseconds, rounded up), and slept node by
node those delays added up, so a prompt of three 66.7 ms nodes took 209 ms instead of 200. The wait also aims
early by how late the loop has been waking up lately (``Pace.lateness``) and yields to the loop for what is
left, so the last node ends at its deadline too; and the last node's wait ends early by what the prompt's end
takes after it (``Pace.tail``), learnt over the prompts that succeeded.
"""

from __future__ import annotations

import asyncio

from .nodework import NodeFailure

MAX_TAIL = 0.003
"""The most ``Pace.tail`` takes off a prompt's last wait: a prompt's own bookkeeping is about 1 ms here."""
MAX_LATENESS = 0.003
"""How early a node's wait may aim: at most what the loop's wake-ups are late on an idle machine (epoll's
whole milliseconds). On a loaded one they are later still, and that rest is waited out as before."""


class Pace:
    """What the server learns about its own timing over its lifetime."""

    def __init__(self) -> None:
        self.lateness = 0.0
        """Seconds the event loop has been waking up after a node's wait should have ended (a running mean)."""
        self.tail = 0.0
        """Seconds from the end of a prompt's node time to its end (its last messages, its history, executing
        None), learnt over the prompts that succeeded and taken off the last node's wait."""

    def ended(self, nominal_end: float) -> None:
        """A prompt that succeeded has sent its end (history written, executing None): learn how far past its
        node time that came, so the next prompt's last wait ends that much earlier. Before, the fake's 0.6-1.2 ms
        of bookkeeping came on top of T and no client could reach T."""
        over = asyncio.get_running_loop().time() - nominal_end
        self.tail = min(max(self.tail + over / 4, 0.0), MAX_TAIL)

    def woke(self, late: float) -> None:
        """A wait ended ``late`` seconds after it aimed to."""
        self.lateness = min(max(self.lateness + (late - self.lateness) / 4, 0.0), MAX_LATENESS)


class RunClock:
    """One prompt's node time: started at its execution_start, a node's time added as the node runs."""

    def __init__(self, pace: Pace, interrupt: asyncio.Event) -> None:
        self.pace = pace
        self.interrupt = interrupt
        self.started = 0.0
        """The loop's clock at execution_start: node times are kept against it."""
        self.planned = 0.0
        """Seconds of node time (node_ms, load_ms, progress steps) this run has been given so far."""
        self.last_node: str | None = None
        """The node that runs last: its wait ends ``Pace.tail`` early, for the prompt's bookkeeping after it."""

    def start(self) -> None:
        self.started = asyncio.get_running_loop().time()

    def nominal_end(self) -> float | None:
        """When the prompt should end: execution_start + the node time given (None when none was)."""
        return self.started + self.planned if self.planned > 0 else None

    async def work(self, node_id: str, ms: float) -> None:
        """A node's time; an interrupt (set before or during it) stops the prompt at this node.

        ComfyUI checks the flag before each node and samplers check it at every step, so the running
        node is where the interrupt lands either way: "executing X", then execution_interrupted at X.
        """
        loop, flag = asyncio.get_running_loop(), self.interrupt
        self.planned += max(ms, 0) / 1000
        deadline = self.started + self.planned - (self.pace.tail if node_id == self.last_node else 0.0)
        target = deadline - self.pace.lateness
        if not flag.is_set() and target > loop.time():
            try:
                await asyncio.wait_for(flag.wait(), target - loop.time())
            except TimeoutError:
                self.pace.woke(loop.time() - target)
        while not flag.is_set() and loop.time() < deadline:
            await asyncio.sleep(0)  # the rest, a fraction of a millisecond: let the loop run meanwhile
        if flag.is_set():
            raise NodeFailure(node_id)
