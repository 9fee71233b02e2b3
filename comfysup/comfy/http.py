"""A ComfyUI client: HTTP on one kept-alive http.client connection (comfysup.comfy.transport), events on
websocket-client's connection (comfysup.comfy.events, its frames read by comfysup.comfy.frames).

Every HTTP call is bounded as a whole (comfysup.comfy.deadline: headers and body within the call's
timeout, however slowly the bytes come), every body read is bounded in size, and every answer passes
through comfysup.comfy.wire before anything reads it. Errors are sorted here into what the failure table
needs: a 400 from POST /prompt is ``PromptRejected`` (permanent), anything that says the server is unwell
or unreachable is ``ServerUnavailable`` (transient, waited out by the follow loop for a while), and an
answer of the wrong shape is ``MalformedAnswer`` (transient, ending the attempt at once). The socket has a
receive timeout so the runner's loop wakes up to renew its lease, poll /history and check its deadline.

The standard library's http.client, not requests or urllib3: a runner makes its calls one at a time to one
server it already knows, on one connection, retries nothing itself and bounds each call with its own deadline,
so a pool's get and put, Timeout objects, retry checks and a response wrapper buy nothing. requests' per-call
work (merging settings, cookies, hooks, re-parsing the URL) cost about 0.7 ms of CPU a call on this project's
two-core test machine, where four runners share the CPUs with their four servers (bench/e2e.py); urllib3's
one-connection pool, used until 2026-12, took 165-214 µs of CPU a GET /queue against fake_comfy, http.client
70-102 µs. Through this client (wire checks and deadline included; 3000 calls, four rounds each, 2026-12-04):
GET /queue 199-245 -> 108-147 µs, POST /prompt 270-360 -> 173-251 µs. urllib3 is left its multipart encoder (uploads).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Sequence
from http.client import HTTPException, HTTPResponse
from typing import Any
from urllib.parse import urlencode, urlsplit

from comfysup.comfy import deadline, wire
from comfysup.comfy.deadline import DeadlineExceeded
from comfysup.comfy.errors import (
    ComfyError,
    MalformedAnswer,
    PermanentError,
    PromptRejected,
    ServerUnavailable,
    describe_rejection,
    short,
)
from comfysup.comfy.events import EventStream
from comfysup.comfy.runs import LOOK_ENTRIES, KnownRuns, QueueEntry
from comfysup.comfy.transport import CannotConnect, Connection, TooLarge

CLIENT_PREFIX = "comfysup-"
MAX_BODY_BYTES = 16 * 2**20
"""The largest JSON answer read (a history entry, a queue, an error); /object_info may be larger."""
MAX_OBJECT_INFO_BYTES = 256 * 2**20
"""/object_info of a server with hundreds of custom nodes is tens of MiB."""


UPLOAD_MIN_BYTES_PER_SECOND = 10 * 2**20
"""An upload's time limit grows with its size (100 MiB: 10 s at least, or the HTTP timeout when longer)."""


def new_client_id() -> str:
    return f"{CLIENT_PREFIX}{uuid.uuid4()}"


class ComfyClient:
    """One ComfyUI server, by URL (ComfyUI is reached directly: no proxy variables, no .netrc)."""

    def __init__(self, url: str, *, timeout_seconds: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self._prefix = urlsplit(self.url).path
        # One connection: a runner makes one call at a time. No retries: a failure is the runner's to judge.
        self.connection = Connection(self.url)
        self.stream: EventStream | None = None
        """This client's own socket, kept open from one prompt to the next (see ``own_stream``)."""
        self.previews = False
        """Whether its sockets read preview frames (``EventStream.previews``; the runner's, for the API)."""
        self.comfyui_version: str | None = None
        """The server's ComfyUI version as /system_stats last said (None: not asked yet, or not said)."""
        self.known = KnownRuns()
        """The prompt ids the server holds or ran, as far as this client knows (see ``may_have_run``)."""

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None
        self.connection.close()

    def _drop_connection(self) -> None:
        """A call cut in the middle (a deadline, a body too large, a broken answer) leaves its connection in an
        unknown state: closed, so the next call starts on a fresh connection."""
        self.connection.drop()

    # -- HTTP -----------------------------------------------------------------------------------------

    def _call(self, method: str, path: str, *, timeout: float | None = None, body: bytes | None = None,
              fields: dict[str, str] | None = None, stream: bool = False,
              max_bytes: int = MAX_BODY_BYTES, content_type: str = "application/json",
              ) -> tuple[HTTPResponse, bytes]:
        """The answer and its body (read whole, at most ``max_bytes``; empty for a ``stream``), all of it
        within ``timeout`` however slowly it comes. Nothing is sent again after a failure: the runner judges."""
        seconds = timeout or self.timeout_seconds
        target = self._prefix + path + (f"?{urlencode(fields)}" if fields else "")
        try:
            with deadline.within(seconds, f"{method} {path}") as own:
                response = self.connection.request(method, target, body, content_type, seconds)
                data = b"" if stream and response.status < 300 else self.connection.read(response, max_bytes)
        except DeadlineExceeded as exc:
            self._drop_connection()
            if exc.due is not own:
                raise  # the attempt's deadline or a stop, not this call's: the caller's to handle
            raise ServerUnavailable(f"{method} {path}: no complete answer within {seconds:g} s", "connection") from None
        except CannotConnect as exc:
            if isinstance(exc.cause, TimeoutError):  # no connection within the timeout: the server may be busy
                raise ServerUnavailable(f"{method} {path}: timed out after {seconds:g} s", "connection") from exc
            self.known.forget()  # down: it comes back restarted, without its history
            raise ServerUnavailable(f"{method} {path}: {short(exc.cause)}", "connection") from exc
        except TooLarge:
            raise MalformedAnswer(f"{method} {path}: the answer is larger than {max_bytes // 2**20} MiB") from None
        except TimeoutError as exc:
            self._drop_connection()
            raise ServerUnavailable(f"{method} {path}: timed out after {seconds:g} s", "connection") from exc
        except (HTTPException, OSError) as exc:
            self._drop_connection()
            self.known.forget()  # a kept connection cut: a restart cuts them all
            raise ServerUnavailable(f"{method} {path}: {_broken(exc)}", "connection") from exc
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
        """Whether the server may hold or have run ``prompt_id`` (another queue, or a restored backup,
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
        import urllib3  # its multipart encoder, here only: a runner whose jobs bring no file never imports urllib3

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

    def free(self, unload_models: bool = True, free_memory: bool = True) -> None:
        """POST /free: ComfyUI unloads its models and empties the device's cache once its worker is idle (after the
        running prompt, if any); raises ServerUnavailable when the server did not take it."""
        body = json.dumps({"unload_models": unload_models, "free_memory": free_memory}).encode()
        response, data = self._call("POST", "/free", body=body)
        if response.status != 200:
            raise ServerUnavailable(f"POST /free {response.status}, {_first_line(data, response)}", "http")

    def delete_queued(self, prompt_ids: Sequence[str]) -> None:
        self._call("POST", "/queue", body=json.dumps({"delete": list(prompt_ids)}).encode())

    def view(self, filename: str, subfolder: str, kind: str) -> Iterator[bytes]:
        """Stream one output file's bytes; raises ServerUnavailable on any error."""
        response, _ = self._call("GET", "/view", fields={"filename": filename, "subfolder": subfolder, "type": kind},
                                 stream=True)
        if response.status != 200:  # its body was read whole: the connection is kept
            raise ServerUnavailable(f"GET /view {filename!r}: {response.status}", "download")
        try:  # on a connection of its own: cut short (a deadline, a file over the cap, an error), it is closed
            yield from self.connection.stream(response, 1 << 16)
        except (HTTPException, OSError) as exc:
            raise ServerUnavailable(f"GET /view {filename!r}: {_broken(exc)}", "download") from exc

    # -- WebSocket ------------------------------------------------------------------------------------

    def events(self, client_id: str) -> EventStream:
        stream = EventStream(self.url, client_id, self.timeout_seconds)
        stream.previews = self.previews
        return stream

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


def _decoded(data: bytes, what: str, check: Any = None) -> Any:
    """JSON of a server's answer (comfysup.comfy.wire's strict decoding), passed through ``check`` when given,
    or MalformedAnswer saying why."""
    try:
        body = wire.decode(data, what)
        return body if check is None else check(body)
    except wire.Malformed as exc:
        raise MalformedAnswer(f"server sent a malformed answer: {exc}") from None


def _broken(exc: BaseException) -> str:
    """A failed exchange as a reason: an OSError's (``connection reset``), or http.client's broken answer by name
    (``connection broken: IncompleteRead(10 bytes read, 90 more expected)``)."""
    return short(exc) if isinstance(exc, OSError) else f"connection broken: {exc!r}"[:300]


def _first_line(data: bytes, response: HTTPResponse) -> str:
    """The first line of an error body, for a reason (redacted and bounded by the attempt after)."""
    text = data[:4096].decode("utf-8", "replace").strip().splitlines()
    return (text[0] if text else response.reason or "")[:300]
