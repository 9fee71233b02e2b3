"""What one attempt saw, built from ComfyUI's events: phases, each node's time, cached nodes, progress.

People ask "where is my job, how far along, where did the time go". ComfyUI tells a client all of it on
the socket (``execution_start``, ``execution_cached``, ``executing`` per node, ``progress`` per step), so
the attempt feeds every event of its prompt here, writes the live progress to the queue (at most once a
second), and stores the whole trace with the attempt's outcome; ``comfysup show`` prints it as a
timeline.

Pure: every method takes the time (UTC epoch seconds, as stored) and nothing here does I/O, so it is
tested as a table of events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_NODES = 500
"""Node timings kept per attempt: a trace stays a few KB however large the workflow."""
MAX_ERROR_CHARS = 64 * 1024
"""Of ComfyUI's exception message and traceback kept in memory; the attempt redacts them, then cuts them shorter."""
HISTORY_EVENTS = ("execution_cached", "execution_error")
MAX_RECONNECTS = 50
"""Dropped WebSockets kept per attempt (the first ones: a socket that drops more often says enough)."""
PHASES = ("claimed", "followed", "adopted", "posted", "executing", "downloading", "recorded")
"""claimed → posted (waiting in ComfyUI's queue) → executing (after execution_start) → downloading →
recorded; an attempt that caught up with an earlier run is ``followed`` or ``adopted`` instead of posted."""


@dataclass
class NodeTime:
    id: str
    class_type: str
    started: float
    ended: float | None = None


@dataclass
class Trace:
    """The trace of one attempt. ``changed`` says whether ``progress()`` moved since it was last written."""

    classes: dict[str, str]
    phases: list[tuple[str, float]] = field(default_factory=list)
    nodes: list[NodeTime] = field(default_factory=list)
    cached: list[str] = field(default_factory=list)
    current: NodeTime | None = None
    step: tuple[int, int] | None = None
    reconnects: list[tuple[float, bool]] = field(default_factory=list)
    """When the WebSocket dropped, and whether it was connected again at once (same client id)."""
    changed: bool = False
    error: dict[str, Any] | None = None
    """ComfyUI's ``execution_error``: the node, its class, the exception's type, message and traceback (the API's
    ``JobError``); as ComfyUI sent it: the attempt redacts it before it is stored."""

    @classmethod
    def start(cls, workflow: dict[str, Any], now: float) -> Trace:
        classes = {str(k): str(v.get("class_type", "?")) if isinstance(v, dict) else "?" for k, v in workflow.items()}
        return cls(classes=classes, phases=[("claimed", now)])

    def phase(self, name: str, now: float) -> None:
        """Enter a phase; closing the running node when execution is over."""
        if name in ("downloading", "recorded"):
            self._close(now)
        if not self.phases or self.phases[-1][0] != name:
            self.phases.append((name, now))
            self.changed = True

    def reconnected(self, now: float, ok: bool) -> None:
        """The WebSocket dropped at ``now``; ``ok``: connected again (else the next wake-up tries)."""
        if len(self.reconnects) < MAX_RECONNECTS:
            self.reconnects.append((now, ok))

    def on_event(self, kind: str | None, data: dict[str, Any], now: float) -> None:
        """One event of this attempt's prompt, in the order the socket delivered it."""
        handler = _EVENTS.get(kind)  # type: ignore[arg-type]
        if handler is not None:
            handler(self, data, now)

    def _started(self, data: dict[str, Any], now: float) -> None:
        self.phase("executing", now)

    def _cached(self, data: dict[str, Any], now: float) -> None:
        nodes = data.get("nodes") or []
        self.cached = (self.cached + [str(n) for n in nodes if str(n) not in self.cached])[:MAX_NODES]
        self.changed = True

    def _executing(self, data: dict[str, Any], now: float) -> None:
        node = data.get("node")
        self._close(now)
        if node is None:
            return
        node = str(node)
        self.current = NodeTime(node, self.classes.get(node, "?"), now)
        if len(self.nodes) < MAX_NODES:
            self.nodes.append(self.current)
        self.step = None
        self.changed = True

    def _progress(self, data: dict[str, Any], now: float) -> None:
        value, maximum = data.get("value"), data.get("max")
        if isinstance(value, int | float) and isinstance(maximum, int | float) and maximum > 0:
            self.step = (int(value), int(maximum))
            self.changed = True

    def _succeeded(self, data: dict[str, Any], now: float) -> None:
        self._close(now)

    def _failed(self, data: dict[str, Any], now: float) -> None:
        node = data.get("node_id")
        lines = data.get("traceback") if isinstance(data.get("traceback"), list) else []
        self.error = {"node_id": None if node is None else str(node),
                      "class_type": data.get("node_type") or self.classes.get(str(node)),
                      "exception_type": str(data.get("exception_type") or ""),
                      "message": str(data.get("exception_message") or "")[:MAX_ERROR_CHARS],
                      "traceback": "".join(str(line) for line in lines)[:MAX_ERROR_CHARS] or None}

    def from_history(self, entry: dict[str, Any], now: float) -> None:
        """A history entry's ``execution_cached`` and ``execution_error`` messages, for a run read from /history
        rather than watched on the socket (adopted, or polled): the cached nodes (the API's ``outputs_reused``),
        a failure's node and traceback (its job ``error``)."""
        for message in (entry.get("status") or {}).get("messages") or []:
            if isinstance(message, list) and len(message) == 2 and message[0] in HISTORY_EVENTS \
                    and isinstance(message[1], dict):
                self.on_event(message[0], message[1], now)

    def _close(self, now: float) -> None:
        if self.current is not None and self.current.ended is None:
            self.current.ended = now
        self.current = None
        self.step = None

    def progress(self) -> dict[str, Any] | None:
        """Node k of n (n: the workflow's nodes that ComfyUI did not serve from its cache) and step i of m.

        None before anything ran: there is no progress to show while the prompt waits in ComfyUI's queue.
        """
        phase = self.phases[-1][0] if self.phases else None
        if phase is None or phase in ("claimed", "posted"):
            return None
        total = max(1, len(self.classes) - len(self.cached))
        out: dict[str, Any] = {"phase": phase, "node": min(len(self.nodes), total), "nodes": total,
                               "cached": len(self.cached)}
        if self.current is not None:
            out["node_id"] = self.current.id
            out["class_type"] = self.current.class_type
        if self.step is not None:
            out["step"], out["steps"] = self.step
        return out

    def as_dict(self) -> dict[str, Any]:
        """What is stored with the attempt (JSON): phases, node times in run order, cached nodes, progress, and
        the attempt's two figures (``figures``), which metrics read without the rest."""
        phases = [[name, at] for name, at in self.phases]
        wait, run = figures({"phases": phases})
        return {
            "phases": phases,
            **({"comfyui_wait_s": round(wait, 6), "run_s": round(run, 6)} if run is not None else {}),
            "nodes": [{"id": n.id, "class_type": n.class_type, "started": n.started,
                       "seconds": None if n.ended is None else round(n.ended - n.started, 6)} for n in self.nodes],
            "cached": list(self.cached),
            "total_nodes": len(self.classes),
            "progress": self.progress(),
            **({"reconnects": [[at, ok] for at, ok in self.reconnects]} if self.reconnects else {}),
            **({"error": dict(self.error)} if self.error else {}),
        }


_EVENTS: dict[str, Callable[[Trace, dict[str, Any], float], None]] = {
    "execution_start": Trace._started, "execution_cached": Trace._cached, "executing": Trace._executing,
    "progress": Trace._progress, "execution_success": Trace._succeeded, "execution_error": Trace._failed,
}
"""What each of ComfyUI's events does to a trace (any other is not traced)."""


def phase_durations(trace: dict[str, Any]) -> list[tuple[str, float, float | None]]:
    """(phase, start, seconds until the next phase) from a stored trace; the last phase has no length."""
    phases = [(str(p[0]), float(p[1])) for p in trace.get("phases") or [] if isinstance(p, list) and len(p) == 2]
    return [(name, at, (phases[i + 1][1] - at) if i + 1 < len(phases) else None)
            for i, (name, at) in enumerate(phases)]


def figures(trace: dict[str, Any] | None) -> tuple[float, float | None]:
    """(waited in ComfyUI's queue, ran) of an attempt, in seconds, from its stored trace: the wait is the
    ``posted`` phase, from its POST to its execution_start (to its end when it never started; 0 when it was not
    posted: it followed or adopted a run); the run is the rest of the attempt, from its claim to its end. A job
    queued ahead waits behind the prompt ahead of it: that time is its wait, never its run. ``ran`` is None
    without phases to measure (no trace: the attempt's runner died or its lease expired)."""
    phases = phase_durations(trace or {})
    if len(phases) < 2:
        return 0.0, None
    wait = sum(seconds or 0.0 for name, _, seconds in phases if name == "posted")
    total = phases[-1][1] - phases[0][1]
    return max(0.0, wait), max(0.0, total - wait)
