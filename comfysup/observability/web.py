"""The endpoint at ``[metrics] listen``: ``/metrics`` for Prometheus, ``/`` a read-only status page, and
``/files/<job id>/<name>`` serving the result store's files read-only.

The page is plain HTML from the standard library (no build step, no JavaScript): it reloads itself every
``refresh_seconds`` and shows what ``comfysup status --watch`` shows, plus the last finished jobs with
their files linked. Nothing on it can change anything: only GET and HEAD are answered.

Files are served only from inside the store directory: the job id must be a canonical UUID, every part of
the name is checked as the runner checks names from ComfyUI (no ``..``, no absolute path, no NUL, no
backslash), and the resolved path must still be inside ``<store>/<job id>`` (a symlink pointing out is
refused). Everything shown went through the redaction of secrets when it was stored (reasons) or is
masked here (nothing of a job's workflow, extra_data or meta is shown at all).

The server is comfysup.observability.httpserver's: a few threads, a bound on connections, deadlines for a
request to arrive and for its answer to be taken.
"""

from __future__ import annotations

import html
import json
import logging
import os
import socket
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from comfysup import assets, safefs
from comfysup.jobs import JobLineError, canonical_id
from comfysup.observability.brokerview import broker_text
from comfysup.observability.httpserver import PooledHTTPServer, TimedHandler
from comfysup.observability.metrics import CONTENT_TYPE, Metrics
from comfysup.observability.views import (
    POSTED_TEXT,
    WINDOW_SECONDS,
    Overview,
    outboxes_text,
    overview,
    progress_fraction,
    progress_text,
    several_tenants,
    staging_text,
    tenant_lines,
)
from comfysup.queue.base import Queue
from comfysup.queue.run_values import JobRecord
from comfysup.redact import Redactor, bound
from comfysup.runner.store import UnsafeName, check_part
from comfysup.slotstate import memory_note, readiness, warmup_cell
from comfysup.storage.links import no_links
from comfysup.timefmt import age

log = logging.getLogger("comfysup.observability.web")
PAGE_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
FILE_CSP = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; sandbox"
INLINE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif", "audio/mpeg", "audio/flac",
                          "audio/wav", "video/mp4", "video/webm", "text/plain"})
"""Types a browser may show in place; anything else is a download (an SVG or HTML output could script)."""
THUMBNAIL_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})


@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes
    headers: dict[str, str]
    file: int | None = None
    """An open descriptor whose ``size`` bytes are the body instead: sent with sendfile, then closed, so
    serving a 2 GB output costs no memory."""
    size: int = 0

    def content(self) -> bytes:
        """The whole body (for tests and small answers: the handler streams a file instead)."""
        return self.body if self.file is None else os.pread(self.file, self.size, 0)

    def close(self) -> None:
        if self.file is not None:
            os.close(self.file)
            self.file = None


class App:
    """Routes to answers; the HTTP plumbing stays in the handler so this is tested without sockets."""

    def __init__(self, queue: Queue, metrics: Metrics, state: Callable[[], dict[str, Any] | None], store: Path,
                 refresh_seconds: float = 2.0, done_limit: int = 12, ready_max_queue_per_slot: float = 0.0,
                 links: Callable[[str], dict[str, Any]] = no_links, image_origin: str = "") -> None:
        self.queue = queue
        self.ready_max_queue_per_slot = ready_max_queue_per_slot
        self.links = links
        """Presigned URLs of outputs in a bucket: a file link of such an output redirects there."""
        self.page_csp = PAGE_CSP.replace("img-src 'self'", f"img-src 'self' {image_origin}") if image_origin \
            else PAGE_CSP
        """The bucket's origin allowed for images: a thumbnail's /files link of an output there redirects to it."""
        self.metrics = metrics
        self.state = state
        self.store = store
        self.refresh_seconds = refresh_seconds
        self.done_limit = done_limit

    def get(self, raw_path: str) -> Answer:
        path = urllib.parse.urlsplit(raw_path).path
        if path == "/metrics":
            return Answer(200, CONTENT_TYPE, self.metrics.exposition(), {})
        if path == "/ready":  # readiness for load balancers (comfysup.slotstate.readiness)
            answer = readiness(self.state(), self.queue.reads.status(dead_limit=0).counts.get("queued", 0),
                               self.ready_max_queue_per_slot)
            return Answer(200 if answer.ready else 503, "application/json", json.dumps(answer.body()).encode(),
                          {"Cache-Control": "no-store"})
        if path in ("/", "/index.html"):
            view = overview(self.queue, self.state(), dead=5, done=self.done_limit)
            body = render_page(view, self.refresh_seconds).encode()
            return Answer(200, "text/html; charset=utf-8", body, {"Content-Security-Policy": self.page_csp,
                                                                   "Cache-Control": "no-store"})
        if path.startswith("/files/"):
            return self.file(path[len("/files/"):])
        return _text(404, "not found")

    def file(self, rest: str) -> Answer:
        """A file of the result store, or 404: nothing outside ``<store>/<job id>`` is ever read."""
        job, _, name = rest.partition("/")
        try:
            canonical_id(job)
            parts = [check_part(urllib.parse.unquote(p), "name") for p in name.split("/")]
        except (JobLineError, UnsafeName):
            return _text(404, "not found")
        try:
            root = safefs.open_root(self.store)
        except OSError:
            return _text(404, "not found")
        try:
            # Every step without following a symlink: a job folder or a file that is a link is not served.
            with safefs.dir_beneath(root, [job, *parts[:-1]]) as folder:
                fd = safefs.open_file(folder, parts[-1])
        except OSError:
            return self._in_bucket(job, "/".join(parts))
        finally:
            os.close(root)
        name = parts[-1]
        kind = assets.media_type(name)
        headers = {"Content-Security-Policy": FILE_CSP, "Cache-Control": "private, max-age=60"}
        if kind not in INLINE_TYPES:
            headers["Content-Disposition"] = f"attachment; filename*=UTF-8''{urllib.parse.quote(name)}"
        return Answer(200, kind, b"", headers, file=fd, size=os.fstat(fd).st_size)


    def _in_bucket(self, job_id: str, name: str) -> Answer:
        """307 to a presigned URL when the job's output of that name is in a bucket ([store] url); else 404."""
        try:
            record = self.queue.reads.get(job_id)
        except Exception:  # not found, or the queue does not answer: nothing to serve
            return _text(404, "not found")
        for output in record.outputs:
            link = self.links(output.path) if output.name == name else {}
            if "url" in link:
                return Answer(307, "text/plain; charset=utf-8", b"", {"Location": link["url"],
                                                                       "Cache-Control": "no-store"})
        return _text(404, "not found")


def _text(status: int, message: str) -> Answer:
    return Answer(status, "text/plain; charset=utf-8", (message + "\n").encode(), {})


def file_link(job_id: str, name: str) -> str:
    return f"/files/{job_id}/" + "/".join(urllib.parse.quote(p) for p in name.split("/"))


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.2em 2em;color:#1d2330;background:#fafbfc}
h1{font-size:20px;margin:0 0 .2em}h2{font-size:15px;margin:1.4em 0 .4em;color:#46516a}
table{border-collapse:collapse;background:#fff;box-shadow:0 0 0 1px #dde2ea}
th,td{padding:.3em .7em;text-align:left;border-bottom:1px solid #eef0f4;vertical-align:top}
th{font-weight:600;background:#f2f4f8}code{font:12px ui-monospace,monospace}
.counts span{display:inline-block;margin-right:1.2em}.counts b{font-size:18px}
.running{color:#1a6fd1}.done{color:#1e8a4a}.dead{color:#c0392b}.muted{color:#7a849a}
.bar{width:160px;height:10px;background:#e5e9f0;border-radius:5px;overflow:hidden;display:inline-block;
vertical-align:middle;margin-right:.5em}.bar i{display:block;height:100%;background:#1a6fd1}
img.thumb{width:48px;height:48px;object-fit:cover;border:1px solid #dde2ea;margin-right:4px;vertical-align:middle}
.stale{background:#fff4e5;padding:.4em .7em;border:1px solid #f0c36d}
"""


def render_page(view: Overview, refresh_seconds: float) -> str:
    """The status page: same sections as ``status --watch``, and the last finished jobs' files linked."""
    out = _head(view, refresh_seconds)
    out += _supervisor_note(view)
    out += _counts(view)
    out.append(f"<p>{html.escape(outboxes_text(view.outboxes))}</p>")
    full = staging_text(view.supervisor)
    if full:
        out.append(f"<p class=stale>{html.escape(full)}</p>")
    if several_tenants(view.tenants):
        out.append(f"<h2>Tenants</h2><pre>{html.escape(chr(10).join(tenant_lines(view.tenants)))}</pre>")
    state = view.supervisor
    if state is not None and "broker" in state:
        out.append(f"<h2>RabbitMQ</h2><pre>{html.escape(broker_text(state['broker'], view.announcements))}</pre>")
    if state is not None:
        out += _slots_table(state)
    out.append("<h2>Running</h2>")
    out += _running_table(view) if view.status.running else ["<p class=muted>nothing running</p>"]
    out.append("<h2>Last finished</h2>")
    out += _finished_table(view) if view.recent_done else ["<p class=muted>none yet</p>"]
    out.append("<h2>Last dead letters</h2>")
    out += _dead_table(view) if view.status.recent_dead else ["<p class=muted>none</p>"]
    out.append("<p class=muted><a href='/metrics'>/metrics</a></p></body></html>")
    return "\n".join(out)


def _head(view: Overview, refresh_seconds: float) -> list[str]:
    """The document's head (title with the counts, the reload) and the page's heading."""
    c = view.status.counts
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(view.now))
    return ["<!doctype html><html lang=en><head><meta charset=utf-8>",
            f'<meta http-equiv="refresh" content="{refresh_seconds:g}">',
            "<meta name=viewport content='width=device-width'>",
            f"<title>comfysup: {c['running']} running, {c.get('posted', 0)} posted, "
            f"{c['queued'] + c['waiting']} waiting</title>",
            f"<style>{STYLE}</style></head><body>",
            f"<h1>comfysup</h1><div class=muted>at {html.escape(when)}, reloads every {refresh_seconds:g} s</div>"]


def _supervisor_note(view: Overview) -> list[str]:
    """The supervisor's summary, or why there is none (never run, or no longer running)."""
    state = view.supervisor
    if state is None:
        return ["<p class=stale>No supervisor state (comfysup run has not run with this queue).</p>"]
    if view.stale:
        return [f"<p class=stale>Supervisor not running: {html.escape(view.stale)}. Slots as last known.</p>"]
    return [f"<p>{html.escape(bound(str(state.get('summary', '')), 300))}</p>"]


def _counts(view: Overview) -> list[str]:
    """The jobs by state, and what ended in the last window."""
    c = view.status.counts
    f = view.finished
    return ["<div class=counts>" + "".join(
                f"<span class={k}><b>{c.get(k, 0)}</b> {label}</span>"
                for k, label in (("queued", "queued"), ("waiting", "waiting to retry"),
                                 ("posted", "posted (in a server's queue)"), ("running", "running"),
                                 ("storing", "storing (waiting for the bucket)"), ("done", "done"), ("dead", "dead"),
                                 ("cancelled", "cancelled"))) + "</div>",
            f"<p class=muted>last {WINDOW_SECONDS / 60:.0f} min: {f.get('done', 0)} done "
            f"({view.per_minute:.1f} jobs/min), {f.get('dead', 0)} dead, {f.get('cancelled', 0)} cancelled</p>"]


def _slots_table(state: dict[str, Any]) -> list[str]:
    out = ["<h2>Slots</h2><table><tr><th>slot<th>device<th>server<th>pid<th>port<th>restarts<th>runner<th>ComfyUI"
           "<th>warm-up<th>current job<th>finished<th>reason</tr>"]
    out += [_slot_row(slot) for slot in state.get("slots") or [] if isinstance(slot, dict)]
    out.append("</table>")
    return out


def _slot_row(slot: dict[str, Any]) -> str:
    e = html.escape
    note = memory_note(slot)
    return ("<tr>" + "".join(f"<td>{e(_cell(slot.get(k)))}" for k in (
        "name", "device", "state", "pid", "port", "restarts", "runner_pid", "comfyui_version")) +
        f"<td>{e(warmup_cell(slot))}<td><code>{e(_cell(slot.get('job')))}</code><td>{e(_cell(slot.get('jobs')))}"
        f"<td>{e(bound(str(slot.get('reason') or slot.get('runner_reason') or ''), 200))}"
        f"{e(' ' + note) if note else ''}</tr>")


def _running_table(view: Overview) -> list[str]:
    e = html.escape
    out = ["<table><tr><th>job<th>server<th>attempt<th>elapsed<th>progress</tr>"]
    for r in view.status.running:
        if r.posted:  # waits in its server's queue: how long it has waited, and no bar (nothing ran yet)
            out.append(f"<tr class=muted><td><code>{e(r.id)}</code><td>{e(r.server)}<td>{r.attempt}"
                       f"<td>{e(age(view.now - (r.waiting_since or view.now)))}<td>posted: {e(POSTED_TEXT)}</tr>")
            continue
        share = progress_fraction(r.progress)
        out.append(f"<tr><td><code>{e(r.id)}</code><td>{e(r.server)}<td>{r.attempt}"
                   f"<td>{e(age(view.now - r.started_at))}<td><span class=bar><i style='width:{share * 100:.0f}%'>"
                   f"</i></span>{e(progress_text(r.progress))}</tr>")
    out.append("</table>")
    return out


def _finished_table(view: Overview) -> list[str]:
    e = html.escape
    out = ["<table><tr><th>job<th>workflow<th>finished<th>inputs<th>files</tr>"]
    for job in view.recent_done:
        links = _file_links(job)
        ago = age(view.now - job.finished_at) + " ago" if job.finished_at else "-"
        inputs = "<br>".join(f"{e(i['name'])} <span class=muted>{e(i['hash'][:19])}</span>"
                             for i in assets.listing(job.params))
        out.append(f"<tr><td><code>{e(job.id)}</code><td>{e(job.workflow_name)}<td>{e(ago)}<td>{inputs}"
                   f"<td>{'<br>'.join(links) or '<span class=muted>no files</span>'}</tr>")
    out.append("</table>")
    return out


def _file_links(job: JobRecord) -> list[str]:
    """Each output of a finished job linked (with a thumbnail for an image); a name holding a secret is shown
    masked and not linked."""
    e = html.escape
    links = []
    clean = Redactor.for_job(job.workflow, job.extra_data)
    for o in job.outputs:
        href = e(file_link(job.id, o.name)) if clean(o.name) == o.name else ""
        kind = assets.media_type(o.name)
        thumb = (f"<img class=thumb src='{href}' alt='' loading=lazy>"
                 if href and kind in THUMBNAIL_TYPES else "")
        links.append(f"<a href='{href}'>{thumb}{e(clean(Path(o.name).name))}</a> "
                     f"<span class=muted>{o.sha256[:12]}</span>")
    return links


def _dead_table(view: Overview) -> list[str]:
    e = html.escape
    out = ["<table><tr><th>job<th>when<th>reason</tr>"]
    for job_id, at, reason in view.status.recent_dead:
        out.append(f"<tr><td><code>{e(job_id)}</code><td>{e(age(view.now - at))} ago"
                   f"<td class=dead>{e(bound(reason or '', 300))}</tr>")
    out.append("</table>")
    return out


def _cell(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


class _Handler(TimedHandler):
    server_version = "comfysup"
    sys_version = ""

    def do_GET(self) -> None:
        self._answer(with_body=True)

    def do_HEAD(self) -> None:
        self._answer(with_body=False)

    def _answer(self, with_body: bool) -> None:
        app: App = self.server.app  # type: ignore[attr-defined]
        try:
            answer = app.get(self.path)
        except Exception as exc:  # a queue that does not answer: say so, keep serving
            log.warning("status endpoint: %s failed: %s", self.path.split("?")[0][:100], bound(str(exc), 300))
            answer = _text(503, "the queue does not answer; see the supervisor's log")
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(answer.size if answer.file is not None else len(answer.body)))
            self.send_header("Referrer-Policy", "no-referrer")
            for key, value in answer.headers.items():
                self.send_header(key, value)
            self.end_headers()
            if not with_body:
                return
            if answer.file is not None:
                self.wfile.flush()
                with os.fdopen(os.dup(answer.file), "rb") as f:
                    self.connection.sendfile(f)
            else:
                self.wfile.write(answer.body)
        finally:
            answer.close()

    def _refuse(self) -> None:
        self.send_response(405)
        self.send_header("Allow", "GET, HEAD")
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("status endpoint: " + format, *args)


class StatusServer(PooledHTTPServer):
    def __init__(self, address: tuple[str, int], app: App, **limits: Any) -> None:
        self.app = app
        super().__init__(address, _Handler, **limits)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One log line, never socketserver's traceback on stderr: a client that goes away mid-answer is
        routine, and with ``--log-format json`` every line of the log must stay one JSON object."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.debug("status endpoint: the client went away (%s)", type(exc).__name__)
        else:
            log.warning("status endpoint: a request failed: %s: %s", type(exc).__name__, bound(str(exc), 300))


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9188`` for IPv6) as a bind address; checked by the config already."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def serve(listen: str, app: App, *, max_connections: int = 32, header_seconds: float = 10.0,
          body_seconds: float = 60.0) -> StatusServer:
    """Bind now (an OSError says the port is taken); the caller runs ``serve_forever`` in a thread. The limits
    are ``[metrics] max_connections``, ``header_timeout_seconds`` and ``body_timeout_seconds``."""
    host, port = parse_listen(listen)
    limits = {"max_connections": max_connections, "header_seconds": header_seconds, "body_seconds": body_seconds}
    if ":" in host:
        class _V6(StatusServer):
            address_family = socket.AF_INET6

        return _V6((host, port), app, **limits)
    return StatusServer((host, port), app, **limits)
