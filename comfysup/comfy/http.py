"""A ComfyUI client: HTTP on one kept-alive urllib3 connection pool, events on websocket-client's connection
(its frames read by comfysup.runner.frames).

Every HTTP call is bounded as a whole (comfysup.runner.deadline: headers and body within the call's
timeout, however slowly the bytes come), every body read is bounded in size, and every answer passes
through comfysup.runner.wire before anything reads it. Errors are sorted here into what the failure table
needs: a 400 from POST /prompt is ``PromptRejected`` (permanent), anything that says the server is unwell
or unreachable is ``ServerUnavailable`` (transient, waited out by the follow loop for a while), and an
answer of the wrong shape is ``MalformedAnswer`` (transient, ending the attempt at once). The socket has a
receive timeout so the runner's loop wakes up to renew its lease, poll /history and check its deadline.

urllib3 rather than requests (which is built on it): a runner makes five calls per job to one server
it already knows, and requests' per-call work (merging settings, cookies, hooks, re-parsing the URL)
cost about 0.7 ms of CPU each on this project's two-core test machine, where four runners share the
CPUs with their four servers (bench/e2e.py). Nothing of it is needed here.
"""

from __future__ import annotations

import itertools
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode, urlsplit

import urllib3
import websocket

from comfysup.runner import deadline, frames, wire
from comfysup.runner.deadline import DeadlineExceeded

CLIENT_PREFIX = "comfysup-"
MAX_BODY_BYTES = 16 * 2**20
"""The largest JSON answer read (a history entry, a queue, an error); /object_info may be larger."""
MAX_OBJECT_INFO_BYTES = 256 * 2**20
"""/object_info of a server with hundreds of custom nodes is tens of MiB."""


UPLOAD_MIN_BYTES_PER_SECOND = 10 * 2**20
"""An upload's time limit grows with its size (100 MiB: 10 s at least, or the HTTP timeout when longer)."""


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


def new_client_id() -> str:
    return f"{CLIENT_PREFIX}{uuid.uuid4()}"


def describe_rejection(body: Any) -> str:
    """``prompt_outputs_failed_validation: node 3 (KSampler): value_bigger_than_max: …`` from a 400 body,
    whatever its shape (it is the server's, and may be anything)."""
    if not isinstance(body, dict):
        return str(body)[:500]
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    parts = [str(error.get("type") or error.get("message") or "rejected")[:200]]
    extra = error.get("extra_info") if isinstance(error.get("extra_info"), dict) else {}
    if error.get("type") == "missing_node_type":  # ComfyUI 0.38: the class and the node in extra_info
        class_type = extra.get("class_type")
        what = f"node class {str(class_type)[:120]!r} is not installed on this server" if class_type else \
            "a node has no class_type"
        parts.append(f"{what} (node {str(extra.get('node_id', '?'))[:40]})")
    details = error.get("details")
    if details:
        parts.append(str(details)[:500])
    node_errors = body.get("node_errors") if isinstance(body.get("node_errors"), dict) else {}
    for node_id, node in list(node_errors.items())[:20]:
        node = node if isinstance(node, dict) else {}
        errors = node.get("errors") if isinstance(node.get("errors"), list) else []
        what = "; ".join(
            ": ".join(str(x)[:300] for x in (e.get("type"), e.get("details") or e.get("message")) if x)
            for e in errors[:10] if isinstance(e, dict))
        if any(isinstance(e, dict) and e.get("type") == "dependency_cycle" for e in errors):
            parts.append(f"node {str(node_id)[:40]} ({str(node.get('class_type', '?'))[:80]}): "
                         "dependency_cycle: the workflow's links form a loop")
            continue
        parts.append(f"node {str(node_id)[:40]} ({str(node.get('class_type', '?'))[:80]}): {what}")
    return ": ".join(parts)


class ComfyClient:
    """One ComfyUI server, by URL (ComfyUI is reached directly: no proxy variables, no .netrc)."""

    def __init__(self, url: str, *, timeout_seconds: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._prefix = urlsplit(self.url).path
        # One connection: a runner makes one call at a time. No retries: a failure is the runner's to judge.
        self.pool = urllib3.connection_from_url(self.url, maxsize=1, block=False, retries=False)
        self.stream: EventStream | None = None
        """This client's own socket, kept open from one prompt to the next (see ``own_stream``)."""
        self.comfyui_version: str | None = None
        """The server's ComfyUI version as /system_stats last said (None: not asked yet, or not said)."""
        self.known = KnownRuns()
        """The prompt ids the server holds or ran, as far as this client knows (see ``may_have_run``)."""

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        self.pool.close()

    def _drop_connection(self) -> None:
        """A call cut in the middle (a deadline, a body too large) leaves its connection in an unknown
        state: a new pool, so the next call starts on a fresh connection."""
        self.pool.close()
        self.pool = urllib3.connection_from_url(self.url, maxsize=1, block=False, retries=False)

    # -- HTTP -----------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, timeout: float | None = None, body: bytes | None = None,
              fields: dict[str, str] | None = None, stream: bool = False,
              max_bytes: int = MAX_BODY_BYTES, content_type: str = "application/json",
              ) -> tuple[urllib3.BaseHTTPResponse, bytes]:
        """The answer and its body (read whole, at most ``max_bytes``; empty for a ``stream``), all of it
        within ``timeout`` however slowly it comes."""
        seconds = timeout or self.timeout_seconds
        url = self._prefix + path + (f"?{urlencode(fields)}" if fields else "")
        headers = {"Content-Type": content_type} if body is not None else None
        try:
            with deadline.within(seconds, f"{method} {path}") as own:
                response = self.pool.urlopen(method, url, body=body, headers=headers, timeout=seconds,
                                             retries=False, redirect=False, preload_content=False)
                data = b"" if stream and response.status < 300 else response.read(max_bytes + 1)
        except DeadlineExceeded as exc:
            self._drop_connection()
            if exc.due is not own:
                raise  # the attempt's deadline or a stop, not this call's: the caller's to handle
            raise ServerUnavailable(f"{method} {path}: no complete answer within {seconds:g} s", "connection") from None
        except urllib3.exceptions.NewConnectionError as exc:  # a subclass of ConnectTimeoutError, so first
            self.known.forget()  # down: it comes back restarted, without its history
            raise ServerUnavailable(f"{method} {path}: {_short(exc)}", "connection") from exc
        except urllib3.exceptions.TimeoutError as exc:
            raise ServerUnavailable(f"{method} {path}: timed out after {seconds:g} s", "connection") from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._drop_connection()
            self.known.forget()  # a kept connection cut: a restart cuts them all
            raise ServerUnavailable(f"{method} {path}: {_short(exc)}", "connection") from exc
        if len(data) > max_bytes:
            self._drop_connection()
            raise MalformedAnswer(f"{method} {path}: the answer is larger than {max_bytes // 2**20} MiB")
        if not stream or response.status >= 300:
            response.release_conn()
        if response.status >= 500:
            raise ServerUnavailable(f"{method} {path} {response.status}, {_first_line(data, response)}", "http_5xx")
        return response, data

    def _json(self, method: str, path: str, *, timeout: float | None = None, body: bytes | None = None,
              max_bytes: int = MAX_BODY_BYTES) -> Any:
        response, data = self._call(method, path, timeout=timeout, body=body, max_bytes=max_bytes)
        if response.status != 200:
            raise ServerUnavailable(f"{method} {path} {response.status}, {_first_line(data, response)}", "http")
        return _decoded(data, f"{method} {path}")

    def _checked(self, check: Any, body: Any) -> Any:
        try:
            return check(body)
        except wire.Malformed as exc:
            raise MalformedAnswer(f"server sent a malformed {exc}") from None

    def system_stats(self, timeout_seconds: float | None = None) -> dict[str, Any]:
        stats = self._checked(wire.system_stats, self._json("GET", "/system_stats",
                                                            timeout=timeout_seconds or self.timeout_seconds))
        version = stats.get("system", {}).get("comfyui_version")
        self.comfyui_version = version if isinstance(version, str) else None
        return stats

    def features(self) -> dict[str, Any]:
        """GET /features (what the server says it supports); extra keys are the server's, kept as they are."""
        body = self._json("GET", "/features")
        if not isinstance(body, dict):
            raise MalformedAnswer("server sent a malformed /features: not an object")
        return {str(k)[:100]: v for k, v in list(body.items())[:100] if isinstance(v, (bool, int, float, str))}

    def version(self) -> str | None:
        """The server's version, asked once (a server restarted as another version is met by ``cancel_job``'s
        fallback); None when it cannot be learned."""
        if self.comfyui_version is None:
            try:
                self.system_stats()
            except ComfyError:
                return None
        return self.comfyui_version

    def cancel_job(self, prompt_id: str) -> bool:
        """ComfyUI 0.38's atomic cancel: the prompt is interrupted only if it is still the running one, or
        removed while pending, under the server's queue mutex. False when the server has no such route
        (then the caller interrupts and deletes as for 0.3.64)."""
        response, data = self._call("POST", f"/api/jobs/{prompt_id}/cancel", body=b"{}")
        if response.status in (404, 405):
            self.comfyui_version = None  # another server now (a downgrade): learn it again next time
            return False
        if response.status != 200:
            raise ServerUnavailable(f"POST /api/jobs/{{id}}/cancel {response.status}, {_first_line(data, response)}",
                                    "http")
        return True

    def object_info(self) -> dict[str, Any]:
        return self._checked(wire.object_info, self._json("GET", "/object_info", max_bytes=MAX_OBJECT_INFO_BYTES))

    def queue(self) -> list[QueueEntry]:
        entries = self._checked(wire.queue, self._json("GET", "/queue"))
        return [QueueEntry(number=n, prompt_id=p, client_id=c, running=r) for n, p, c, r in entries]

    def history(self, prompt_id: str, max_files: int = wire.MAX_ITEMS) -> dict[str, Any] | None:
        """The history entry of ``prompt_id`` (checked at every level), or None while ComfyUI has not
        written it."""
        body = self._json("GET", f"/history/{prompt_id}")
        return self._checked(lambda b: wire.history_entry(b, prompt_id, max_files=max_files), body)

    def may_have_run(self, prompt_id: str) -> bool:
        """Whether the server may hold or have run ``prompt_id`` (issue 15 #6: another queue, a restored backup
        may have run a job's id there): False only when this client knows every prompt the server was given
        (see :class:`KnownRuns`) and posted or looked within TRUST_SECONDS, so a job's first POST in a stream of
        them needs no GET /queue and /history/{id} before it (on a real ComfyUI those waited for the running
        prompt's GIL: a tenth of a runner's time on short prompts). True when unsure: the caller asks the
        server, as it always did."""
        known = self.known
        if known.state == "unread":
            try:
                entries = self.queue()
                body = self._json("GET", f"/history?max_items={LOOK_ENTRIES + 1}")
                runs = self._checked(wire.history_numbers, body)
            except MalformedAnswer:
                known.state = "unknown"  # asked per job, as a server whose history cannot be read always was
                return True
            except ComfyError:
                return True  # starting, down: looked at again next time
            known.look(entries, runs if len(runs) <= LOOK_ENTRIES else None, time.monotonic())
        return not known.trusted(time.monotonic()) or prompt_id in known.ids

    def post_prompt(self, prompt: dict[str, Any], prompt_id: str, client_id: str,
                    extra_data: dict[str, Any] | None = None) -> int:
        """Queue a prompt under our id; returns ComfyUI's number for this run of it."""
        payload: dict[str, Any] = {"prompt": prompt, "prompt_id": prompt_id, "client_id": client_id}
        if extra_data:
            payload["extra_data"] = extra_data
        # A post whose fate is unknown (no answer, a 5xx) may have taken a number: the next one's shows it.
        response, data = self._call("POST", "/prompt", body=json.dumps(payload, separators=(",", ":")).encode())
        if response.status == 400:
            self.known.posted(prompt_id, None, time.monotonic())
            try:
                body = wire.decode(data, "POST /prompt's 400 answer")
            except wire.Malformed:
                body = _first_line(data, response)
            raise PromptRejected(f"POST /prompt 400, {describe_rejection(body)}")
        if response.status != 200:
            raise ServerUnavailable(f"POST /prompt {response.status}, {_first_line(data, response)}", "http")
        number = _decoded(data, "POST /prompt's answer", wire.prompt_number)
        self.known.posted(prompt_id, number, time.monotonic())
        return number

    def upload_image(self, name: str, data: bytes, subfolder: str) -> tuple[str, str, str]:
        """POST /upload/image (multipart, overwrite=true): the server's (name, subfolder, type) for the file.
        A 413 (larger than the server's max_upload_size) or a 400 cannot be mended by retrying: permanent."""
        body, content_type = urllib3.encode_multipart_formdata(
            [("image", (name, data, "application/octet-stream")), ("type", "input"), ("subfolder", subfolder),
             ("overwrite", "true")])
        seconds = max(self.timeout_seconds, len(data) / UPLOAD_MIN_BYTES_PER_SECOND)
        response, answer = self._call("POST", "/upload/image", body=body, content_type=content_type, timeout=seconds)
        if response.status in (400, 413):
            raise PermanentError(f"POST /upload/image {response.status} for {name} ({len(data):,} bytes), "
                                 f"{_first_line(answer, response)}", "upload")
        if response.status != 200:
            raise ServerUnavailable(f"POST /upload/image {response.status}, {_first_line(answer, response)}", "upload")
        return _decoded(answer, "POST /upload/image's answer", wire.upload_answer)

    def interrupt(self, prompt_id: str | None = None) -> None:
        self._call("POST", "/interrupt", body=json.dumps({"prompt_id": prompt_id} if prompt_id else {}).encode())

    def delete_queued(self, prompt_ids: Sequence[str]) -> None:
        self._call("POST", "/queue", body=json.dumps({"delete": list(prompt_ids)}).encode())

    def view(self, filename: str, subfolder: str, kind: str) -> Iterator[bytes]:
        """Stream one output file's bytes; raises ServerUnavailable on any error."""
        response, _ = self._call("GET", "/view", fields={"filename": filename, "subfolder": subfolder, "type": kind},
                                 stream=True)
        complete = False
        try:
            if response.status != 200:
                raise ServerUnavailable(f"GET /view {filename!r}: {response.status}", "download")
            try:
                yield from response.stream(1 << 16)
                complete = True
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise ServerUnavailable(f"GET /view {filename!r}: {_short(exc)}", "download") from exc
        finally:
            if complete:
                response.release_conn()
            else:  # cut short (a deadline, a file over the cap): never drain an endless body
                self._drop_connection()

    # -- WebSocket ------------------------------------------------------------------------------------

    def events(self, client_id: str) -> EventStream:
        return EventStream(self.url, client_id, self.timeout_seconds)

    def own_stream(self, fresh: bool = False, drain: bool = True) -> EventStream:
        """This client's kept socket, connected: one per runner, reused for every prompt it posts, so a job
        does not pay a WebSocket handshake. ``fresh``: a new client id first (a job posted again, whose
        earlier run's messages must not be taken for this run's). ``drain``: empty it of what earlier
        prompts left (before posting; never after, when the messages are the new prompt's)."""
        if self.stream is None or fresh:
            if self.stream is not None:
                self.stream.close()
            self.stream = self.events(new_client_id())
        if drain:
            self.stream.drain()
        if self.stream.ws is None:
            self.stream.connect()
        return self.stream


_CONNECTIONS = itertools.count(1)

class SocketLost(ComfyError):
    """The WebSocket closed or failed."""

    kind = "socket_lost"


class EventStream:
    """ComfyUI's WebSocket for one client id. JSON messages only; binary preview frames are skipped."""

    def __init__(self, url: str, client_id: str, connect_timeout_seconds: float) -> None:
        self.url = "ws" + url[4:] + f"/ws?clientId={client_id}" if url.startswith("http") else url
        self.client_id = client_id
        self.connect_timeout_seconds = connect_timeout_seconds
        self.ws: websocket.WebSocket | None = None
        self.frames: frames.FrameReader | None = None
        """The frames after the handshake are read here (comfysup.runner.frames), not by websocket-client."""
        self.connection = 0
        """Which connection reads now (unique in the process, 0 before the first): a message read on another
        one came before a reconnect, and the messages sent in between are lost."""

    def connect(self) -> None:
        """(Re)connect with the same client id. The old socket is closed first: when an old socket of one
        client id closes after a new one opened, ComfyUI silently stops sending to the new one."""
        self.close()
        try:
            # skip_utf8_validation: websocket-client reads frames only in its close() now (its handshake
            # reads byte by byte, so nothing after it is left in a buffer of its own); text is checked by
            # wire.decode's strict UTF-8 anyway.
            self.ws = websocket.create_connection(self.url, timeout=self.connect_timeout_seconds,
                                                  enable_multithread=False, skip_utf8_validation=True)
            self.frames = frames.FrameReader(self.ws.sock)
            self.connection = next(_CONNECTIONS)
        except (OSError, websocket.WebSocketException) as exc:
            self.ws = None
            raise SocketLost(f"WebSocket connect: {_short(exc)}") from exc

    def recv(self, timeout_seconds: float) -> dict[str, Any] | None:
        """The next JSON message the runner reads, or None when ``timeout_seconds`` passed without one.

        ``timeout_seconds`` bounds the whole call, not each frame: frames the runner does not read (a custom
        node's messages, previews, ComfyUI's progress_state) can come faster than it, and the caller's wake-up
        (its heartbeat, a cancel, a stop, the deadline) must not wait for a message it reads. A call of no time
        reads only what is buffered, never waiting: a timeout, however short, is a poll() of at least 1 ms."""
        if self.ws is None or self.frames is None:
            raise SocketLost("WebSocket not connected")
        until = time.monotonic() + timeout_seconds if timeout_seconds > 0 else None
        while True:
            got = self._next(until)
            if got is None:
                return None
            opcode, data = got
            if opcode == frames.TEXT:
                try:
                    message = wire.ws_message(data)
                except wire.Malformed as exc:
                    raise MalformedAnswer(f"server sent a malformed WebSocket message: {exc}") from None
                if message is not None:
                    return message
            # A frame not read (binary previews, unread types): on for what is left of the call's time.

    def _next(self, until: float | None) -> tuple[int, bytes] | None:
        """The next data message (TEXT or BINARY), answering pings and reading more from the socket as needed;
        None when nothing whole came by ``until`` (None: among what is buffered now)."""
        reader = self.frames
        assert self.ws is not None and reader is not None
        while True:
            try:
                got = reader.message()
                if got is None:
                    if not reader.fill(until):
                        return None
                    continue
            except frames.ProtocolError as exc:
                self.close()
                raise SocketLost(f"WebSocket lost: {exc}") from None
            except frames.Closed:
                self.close()
                raise SocketLost("WebSocket closed by the server") from None
            except OSError as exc:
                self.close()
                raise SocketLost(f"WebSocket lost: {_short(exc)}") from exc
            opcode, data = got
            if opcode in (frames.TEXT, frames.BINARY):
                return got
            if opcode == frames.CLOSE:
                self.close()
                raise SocketLost("WebSocket closed by the server")
            if opcode == frames.PING:
                try:
                    self.ws.pong(data)
                except (OSError, websocket.WebSocketException) as exc:
                    self.close()
                    raise SocketLost(f"WebSocket lost: {_short(exc)}") from exc

    def drain(self) -> None:
        """Discard what is already buffered (a finished prompt's last messages, status broadcasts) without
        waiting; a socket found broken is closed, for the caller to reconnect. A frame not yet whole stays in
        the reader for the next call, as the socket's bytes would."""
        if self.ws is None:
            return
        try:
            while self._next(None) is not None:
                pass
        except SocketLost:
            pass  # closed already: the caller reconnects

    def close(self) -> None:
        self.frames = None
        if self.ws is not None:
            try:
                self.ws.close(timeout=0.5)
            except Exception:
                pass
            self.ws = None


def _short(exc: BaseException) -> str:
    """The last, most specific line of a requests/urllib3 error, not its whole nested repr."""
    text = str(exc) or type(exc).__name__
    for marker in ("Connection refused", "Connection reset", "timed out", "Remote end closed", "Broken pipe",
                   "Name or service not known"):
        if marker in text:
            return marker.lower() if marker != "Connection refused" else "connection refused"
    return text[:300]


def _decoded(data: bytes, what: str, check: Any = None) -> Any:
    """JSON of a server's answer (comfysup.runner.wire's strict decoding), passed through ``check`` when given,
    or MalformedAnswer saying why."""
    try:
        body = wire.decode(data, what)
        return body if check is None else check(body)
    except wire.Malformed as exc:
        raise MalformedAnswer(f"server sent a malformed answer: {exc}") from None


def _first_line(data: bytes, response: urllib3.BaseHTTPResponse) -> str:
    """The first line of an error body, for a reason (redacted and bounded by the attempt after)."""
    text = data[:4096].decode("utf-8", "replace").strip().splitlines()
    return (text[0] if text else response.reason or "")[:300]
