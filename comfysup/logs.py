"""Logging for comfysup's processes: one line per event, plain by default, or one JSON object per event.

``--log-format json`` (or ``COMFYSUP_LOG_FORMAT=json``) is for log shippers: each event is an object with
its time, level, message and the job, slot and attempt it concerns (null when it concerns none), so
"everything that happened to job X" is one query instead of a grep through free text.

Whatever the format, every message passes through the redaction of the current job's secrets: the runner
binds the job (and its :class:`~comfysup.redact.Redactor`) for the length of an attempt, so a message that
quotes a ComfyUI error quoting an API key never reaches the log with the key in it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

from comfysup.errors import UsageError

FORMATS = ("plain", "json")
FORMAT_VARIABLE = "COMFYSUP_LOG_FORMAT"
FIELDS = ("job", "slot", "attempt")

_EMPTY: dict[str, Any] = {}
_context: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("comfysup_log_context", default=_EMPTY)
"""The job, slot and attempt of what this process (or thread) is doing, and the job's redactor. Never
mutated in place: each change sets a new dict, so the shared default stays empty."""


def bind(**fields: Any) -> None:
    """Set context fields for the rest of this process or thread (a runner binds its slot once)."""
    _context.set({**_context.get(), **fields})


@contextlib.contextmanager
def job_context(job: str, attempt: int, redact: Callable[[str], str] | None = None) -> Iterator[None]:
    """The job and attempt that log lines inside the block concern, and the redaction of its secrets."""
    token = _context.set({**_context.get(), "job": job, "attempt": attempt, "redact": redact})
    try:
        yield
    finally:
        _context.reset(token)


_ESCAPES = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7f, 0xa0))} | {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}
"""Control characters in a message, written as escapes: a name from ComfyUI holding CR/LF cannot forge a log
line, nor an ESC sequence rewrite a terminal."""


class _Redact(logging.Filter):
    """Renders the message once, scrubbed of the bound job's secrets, and attaches the context fields."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _context.get()
        message = record.getMessage()
        redact = context.get("redact")
        if redact is not None:
            message = redact(message)
        record.msg, record.args = message.translate(_ESCAPES), None
        for name in FIELDS:
            if getattr(record, name, None) is None:
                setattr(record, name, context.get(name))
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, event, message, job, slot, attempt, pid."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name,
            "event": getattr(record, "event", None), "message": record.getMessage(),
        }
        kind = getattr(record, "kind", None)
        if kind and kind != out["event"]:
            out["kind"] = kind  # the reason class of a retry or a dead letter: oom, timeout, http_5xx, …
        for name in FIELDS:
            out[name] = getattr(record, name, None)
        out["pid"] = record.process
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def resolve_format(given: str | None, env: dict[str, str] | None = None) -> str:
    """The flag wins over ``COMFYSUP_LOG_FORMAT``; plain when neither says."""
    env = dict(os.environ) if env is None else env
    chosen = (given or env.get(FORMAT_VARIABLE) or "plain").strip().lower()
    if chosen not in FORMATS:
        raise UsageError(f"log format {chosen!r}: expected one of {', '.join(FORMATS)} (--log-format or "
                         f"${FORMAT_VARIABLE})")
    return chosen


def setup_logging(level: int = logging.INFO, fmt: str | None = None) -> None:
    """Lines on stderr, like the examples in the runner's issue: ``job 1a2b3c4d: done on gpu0 …``, or JSON.

    Called once per process; a second call only changes the format (the handler is kept, so forked
    runners inherit one handler, never two)."""
    chosen = resolve_format(fmt)
    root = logging.getLogger("comfysup")
    handler = next((h for h in root.handlers if getattr(h, "_comfysup", False)), None)
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler._comfysup = True  # type: ignore[attr-defined]
        handler.addFilter(_Redact())
        root.addHandler(handler)
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter("%(message)s"))
    root.setLevel(level)
    root.propagate = False
    # Neither format reads where a call was made, the thread or the multiprocessing name: logging's own
    # "Optimization" switches (the logging HOWTO) skip gathering them for every record. The pid stays (JSON).
    logging._srcfile = None
    logging.logThreads = False
    logging.logMultiprocessing = False
    # Python's warnings (a library's deprecation notice) become log events too, in the same format,
    # instead of bare lines on stderr between JSON objects.
    logging.captureWarnings(True)
    warnings_log = logging.getLogger("py.warnings")
    if handler not in warnings_log.handlers:
        warnings_log.addHandler(handler)
    warnings_log.propagate = False
