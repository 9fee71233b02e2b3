"""What can go wrong talking to ComfyUI, sorted as the failure table needs it (docs/design.md), and what ComfyUI's own
execution errors mean.

``ServerUnavailable`` (the server is unwell or unreachable: transient), ``PermanentError`` (ComfyUI said no:
``PromptRejected`` for a 400 of POST /prompt), ``MalformedAnswer`` (an answer of the wrong shape: transient,
ending the attempt at once), ``SocketLost`` (the WebSocket closed). ``execution_failure`` reads an
``execution_error`` message into a ``Failure``: out of memory and a lost device are transient, anything else
permanent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

OOM_TYPES = frozenset({"torch.OutOfMemoryError", "torch.cuda.OutOfMemoryError", "OutOfMemoryError"})
OOM_MESSAGE = re.compile(r"out of memory|allocation on device", re.I)
DEVICE_LOST_MESSAGE = re.compile(
    r"illegal memory access|device-side assert|misaligned address|unspecified launch failure|ECC error"
    r"|CUDA error: (?:unknown error|an illegal instruction)|no CUDA-capable device|CUDA driver (?:error|version)"
    r"|GPU (?:is )?lost|fallen off the bus|CUDA-capable device\(s\) is/are busy or unavailable", re.I)
"""Errors after which CUDA's context is unusable (the process must go): every later kernel fails the same way."""


DEVICE_LOST = "device_lost"
"""The kind of an execution_error that leaves the device unusable (see is_device_lost)."""


class ComfyError(Exception):
    """A ComfyUI call failed; ``reason`` is what a person reads, ``kind`` the reason class."""

    kind = "connection"

    def __init__(self, reason: str, kind: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        if kind:
            self.kind = kind


class ServerUnavailable(ComfyError):
    """Transient: refused, reset, timed out, or a 5xx."""


class PermanentError(ComfyError):
    """A failure that another attempt cannot mend: the job is dead-lettered at once."""

    kind = "permanent"


class MalformedAnswer(ComfyError):
    """Transient, and at once: the server answered something that is not the shape ComfyUI documents. Not a
    ServerUnavailable, which the follow loop waits out: a server that answers nonsense is not coming back
    with sense, and the attempt ends now (its retry follows the prompt if it still runs)."""

    kind = "malformed"


class PromptRejected(PermanentError):
    """Permanent: POST /prompt answered 400 (validation, node_errors)."""

    kind = "validation"


class SocketLost(ComfyError):
    """The WebSocket closed or failed."""

    kind = "socket_lost"


def describe_rejection(body: Any) -> str:
    """``prompt_outputs_failed_validation: node 3 (KSampler): value_bigger_than_max: …`` from a 400 body,
    whatever its shape (it is the server's, and may be anything)."""
    if not isinstance(body, dict):
        return str(body)[:500]
    error = _dict(body.get("error"))
    parts = [str(error.get("type") or error.get("message") or "rejected")[:200]]
    if error.get("type") == "missing_node_type":  # ComfyUI 0.38: the class and the node in extra_info
        parts.append(_missing_node(_dict(error.get("extra_info"))))
    details = error.get("details")
    if details:
        parts.append(str(details)[:500])
    node_errors = _dict(body.get("node_errors"))
    parts += [_node_rejection(node_id, _dict(node)) for node_id, node in list(node_errors.items())[:20]]
    return ": ".join(parts)


def _dict(value: Any) -> dict[str, Any]:
    """``value`` when the server sent an object there, else an empty one."""
    return value if isinstance(value, dict) else {}


def _missing_node(extra: dict[str, Any]) -> str:
    class_type = extra.get("class_type")
    what = f"node class {str(class_type)[:120]!r} is not installed on this server" if class_type else \
        "a node has no class_type"
    return f"{what} (node {str(extra.get('node_id', '?'))[:40]})"


def _node_rejection(node_id: Any, node: dict[str, Any]) -> str:
    """One node of ``node_errors``: its id, class and errors (a dependency cycle said in words)."""
    errors = node.get("errors") if isinstance(node.get("errors"), list) else []
    head = f"node {str(node_id)[:40]} ({str(node.get('class_type', '?'))[:80]})"
    if any(isinstance(e, dict) and e.get("type") == "dependency_cycle" for e in errors):
        return f"{head}: dependency_cycle: the workflow's links form a loop"
    what = "; ".join(
        ": ".join(str(x)[:300] for x in (e.get("type"), e.get("details") or e.get("message")) if x)
        for e in errors[:10] if isinstance(e, dict))
    return f"{head}: {what}"


@dataclass(frozen=True)
class Failure:
    """Why an attempt failed. ``kind`` is the reason class (metrics, logs); ``reason`` the text."""

    kind: str
    reason: str
    transient: bool


def is_oom(error: dict[str, Any]) -> bool:
    """An out-of-memory execution_error, from its exception type or message, not guessed."""
    kind = str(error.get("exception_type") or "")
    return kind in OOM_TYPES or kind.endswith(".OutOfMemoryError") \
        or bool(OOM_MESSAGE.search(str(error.get("exception_message") or "")))


def is_device_lost(error: dict[str, Any]) -> bool:
    """An ``execution_error`` after which the server's device is unusable until its process restarts: an illegal
    memory access, a device-side assert, a GPU fallen off the bus (CUDA's context is poisoned)."""
    text = f"{error.get('exception_type') or ''}: {error.get('exception_message') or ''}"
    return bool(DEVICE_LOST_MESSAGE.search(text))


def execution_failure(error: dict[str, Any]) -> Failure:
    """The failure an ``execution_error`` message stands for: OOM is transient, and so is a lost device (the
    server is restarted; the job may well run on a healthy one), the rest permanent."""
    # The first line is the message; the rest (ComfyUI's TIPS, a tensor dump) is not a reason.
    lines = [line.strip() for line in str(error.get("exception_message") or "").strip().splitlines()]
    message = lines[0] + (" …" if len(lines) > 1 else "") if lines else ""
    text = (f"execution_error, node {error.get('node_id')} ({error.get('node_type')}): "
            f"{error.get('exception_type')}: {message}")
    if is_oom(error):
        return Failure("oom", text, transient=True)
    if is_device_lost(error):
        return Failure(DEVICE_LOST, text, transient=True)
    return Failure("execution_error", text, transient=False)


def short(exc: BaseException) -> str:
    """The last, most specific line of a requests/urllib3 error, not its whole nested repr."""
    text = str(exc) or type(exc).__name__
    for marker in ("Connection refused", "Connection reset", "timed out", "Remote end closed", "Broken pipe",
                   "Name or service not known"):
        if marker in text:
            return marker.lower() if marker != "Connection refused" else "connection refused"
    return text[:300]
