"""A jobs file's jobs read and built by a forked child process while the parent inserts what it has sent.

A large submit is two parts of similar cost: reading lines and hashing their workflows (Python) and inserting the
rows (SQLite); on two CPUs they overlap. Only each job's own fields cross the pipe, as a tuple (a batch of them
pickles far faster than a batch of NewJobs with their workflows): the queue stores ``template_json`` and
``params``, never ``workflow``, which is left empty. The child is the parent's fork, so it reads the file exactly
as the parent would; if it fails or dies, ``read_ahead`` raises and the caller's transaction rolls back: nothing
is half-inserted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from comfysup.errors import ComfysupError
from comfysup.queue.base import NewJob

NOT_SENT: Mapping[str, Any] = MappingProxyType({})
"""A read-ahead job's ``workflow``: the queue stores its template and ``params`` (see NewJob)."""


def read_ahead(jobs: Callable[[], Iterator[NewJob]], label: str, batch: int) -> Iterator[NewJob]:
    """``jobs()``, run in a forked child, its jobs sent back ``batch`` at a time; ``label`` names the file in
    messages."""
    import multiprocessing  # its pipes and pickling serve a file of READ_AHEAD_LINES or more only

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_send_jobs, args=(jobs, receive, send, batch), name="comfysup-submit-reader",
                            daemon=True)
    child.start()
    send.close()
    try:
        yield from _received(receive, child, label)
    finally:
        receive.close()
        child.join(5.0)
        if child.is_alive():
            child.kill()
            child.join()


def _received(receive: Any, child: Any, label: str) -> Iterator[NewJob]:
    """The jobs the child sends, until its end; ComfysupError when it fails or stops before it."""
    while True:
        try:
            kind, payload = receive.recv()
        except EOFError:
            child.join(5.0)
            raise ComfysupError(f"{label}: the process reading the file stopped (exit code {child.exitcode}) before "
                                "its end; nothing was submitted") from None
        if kind == "end":
            return
        if kind == "error":
            raise ComfysupError(f"{label}: reading the file failed: {payload}; nothing was submitted")
        for (job_id, spec_hash, priority, extra, meta, params, name, text, callback, template, template_hash, key,
             refused, found) in payload:
            yield NewJob(id=job_id, workflow=NOT_SENT, spec_hash=spec_hash, priority=priority, extra_data=extra,
                         meta=meta, params=params, workflow_name=name, workflow_json=text, callback_url=callback,
                         template_json=template, template_hash=template_hash, model_key=key, refused=refused,
                         assets=found)


def _send_jobs(jobs: Callable[[], Iterator[NewJob]], receive: Any, send: Any, batch: int) -> None:
    """The child's side of ``read_ahead``. Its inherited copy of the reading end is closed first: with the parent
    gone (kill -9), the next send then fails and the child ends, instead of filling a pipe that it alone still
    held open and waiting on it forever."""
    receive.close()
    try:
        rows: list[tuple[Any, ...]] = []
        for job in jobs():
            rows.append((job.id, job.spec_hash, job.priority, job.extra_data, job.meta, job.params, job.workflow_name,
                         job.workflow_json, job.callback_url, job.template_json, job.template_hash, job.model_key,
                         job.refused, job.assets))
            if len(rows) >= batch:
                send.send(("jobs", rows))
                rows = []
        send.send(("jobs", rows))
        send.send(("end", None))
    except (BrokenPipeError, ConnectionResetError):
        pass  # the parent stopped reading: it is rolling back, or gone
    except Exception as exc:  # sent to the parent, which raises it in its own transaction
        try:
            send.send(("error", f"{type(exc).__name__}: {exc}"))
        except OSError:
            pass
    finally:
        send.close()
