"""One kept-alive HTTP/1.1 connection to one ComfyUI server, on the standard library's http.client (why not
urllib3: comfysup.comfy.http's docstring).

What urllib3's pool did for the client and http.client does not, done here: an idle kept connection that the
server closed (or sent anything on) is replaced before a request is written to it, never after (POST /prompt is
not idempotent: nothing is ever sent twice); a connection whose last answer was not read to its end is never
reused; a streamed body (GET /view) is read on a connection lent to it, so a call made between its chunks goes on
another, as urllib3's pool lent one; a body is never read past its bound; an answer shorter than its
Content-Length is an ``IncompleteRead`` (http.client's ``read(amt)`` would return it short); and the request
target is percent-encoded as urllib3 encoded it. Errors are left to the caller to sort, except that a failure to
connect is told apart as :class:`CannotConnect`.
"""

from __future__ import annotations

import re
import select
import socket
import ssl
from collections.abc import Iterator
from http.client import HTTPConnection, HTTPResponse, HTTPSConnection, IncompleteRead
from urllib.parse import urlsplit

USER_AGENT = "comfysup"


class CannotConnect(Exception):
    """No connection could be made (refused, unreachable, no such name, no TLS handshake, or none within the
    timeout: ``cause`` says which); nothing was sent."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class TooLarge(Exception):
    """The body is larger than the bound it is read under; the connection has been dropped."""


class Connection:
    """The one connection of a client that makes one call at a time (and one more while a body streams): no pool,
    no retries, no proxy, no .netrc (http.client reads neither the proxy variables nor ~/.netrc)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.https else 80)
        self._conn: HTTPConnection | None = None
        self._response: HTTPResponse | None = None
        """The last answer, while it may still hold the socket (not read to its end: the connection is dropped)."""

    def request(self, method: str, target: str, body: bytes | None, content_type: str,
                timeout: float) -> HTTPResponse:
        """Send one request and read the answer's head. A failure to connect raises CannotConnect; any other
        failure (OSError, http.client.HTTPException) is raised as it is, the connection in an unknown state
        (the caller drops it)."""
        conn = self._ready(timeout)
        headers = {"User-Agent": USER_AGENT}
        if body is not None:
            headers["Content-Type"] = content_type  # and http.client adds Content-Length
        conn.request(method, _target(target), body, headers)
        self._response = response = conn.getresponse()  # one with Connection: close or HTTP/1.0 takes the socket
        return response

    def _ready(self, timeout: float) -> HTTPConnection:
        """The kept connection if it is idle and the server has not closed it, else a new one, connected."""
        response, conn = self._response, self._conn
        if response is not None and not response.isclosed():
            self.drop()  # the last body was not read to its end: what comes next on it is not an answer's head
            conn = None
        elif conn is not None and conn.sock is not None:
            if _readable(conn.sock):  # EOF (closed while idle) or bytes nobody asked for: not reusable
                self.drop()
                conn = None
            else:
                if conn.sock.gettimeout() != timeout:
                    conn.sock.settimeout(timeout)
                return conn
        if conn is None:
            conn = self._conn = (HTTPSConnection(self.host, self.port, timeout=timeout, context=_tls())
                                 if self.https else HTTPConnection(self.host, self.port, timeout=timeout))
        conn.timeout = timeout
        try:
            conn.connect()
        except OSError as exc:  # ssl.SSLError and socket.timeout are OSErrors too
            self.drop()
            raise CannotConnect(exc) from exc
        return conn

    def read(self, response: HTTPResponse, max_bytes: int) -> bytes:
        """The whole body, or TooLarge past ``max_bytes`` (read no further: the connection is dropped);
        IncompleteRead when the connection ends before the body does."""
        if response.length is not None:  # Content-Length: read() checks that all of it came
            if response.length > max_bytes:
                self.drop()
                raise TooLarge()
            return response.read()
        data = response.read(max_bytes + 1)  # chunked (IncompleteRead when cut) or up to the server's close
        if len(data) > max_bytes:
            self.drop()
            raise TooLarge()
        return data

    def stream(self, response: HTTPResponse, size: int) -> Iterator[bytes]:
        """The body of ``response`` (the last answer, its head read) in chunks of at most ``size`` bytes, on a
        connection of its own from the first chunk on: a call made while it is read (between two chunks, the
        runner's checks may post or interrupt) goes on another, as urllib3's pool lent it another. Read to its
        end, it is kept if no other took its place; otherwise (stopped early, an error) closed.
        IncompleteRead when the body ends short of its Content-Length."""
        conn = self._conn if response is self._response else None
        if response is self._response:
            self._conn = self._response = None  # lent to this stream
        complete = False
        try:
            while chunk := response.read(size):
                yield chunk
            if response.length:  # http.client's read(amt) returns a cut body short without saying so
                raise IncompleteRead(b"", response.length)
            complete = True
        finally:
            if complete and conn is not None and conn.sock is not None and self._conn is None:
                self._conn = conn  # back, kept alive (one whose answer said Connection: close has no socket)
            else:
                response.close()
                if conn is not None:
                    conn.close()

    def drop(self) -> None:
        """Close the connection and the answer that may hold its socket: the next request connects anew."""
        response, conn = self._response, self._conn
        self._response = self._conn = None
        if response is not None:
            response.close()
        if conn is not None:
            conn.close()

    close = drop


def _readable(sock: socket.socket) -> bool:
    """Whether an idle socket has something to read: the server's close (EOF) or a reset, or bytes no request
    asked for. urllib3 checked the same before reusing a connection (``is_connection_dropped``)."""
    if _poll is None:
        return bool(select.select([sock], [], [], 0)[0])
    poller = _poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


_poll = getattr(select, "poll", None)

# urllib3's request target: the characters a path and query may hold as they are, and %XX already encoded.
_PLAIN = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?]|%[0-9A-Fa-f]{2})*")
_OTHER = re.compile(r"%(?![0-9A-Fa-f]{2})|[^A-Za-z0-9\-._~!$&'()*+,;=:@/?%]+")


def _target(target: str) -> str:
    """``target`` with every character that may not stand in a request line percent-encoded (UTF-8), as urllib3
    did: an id with a space or a control character in it is sent encoded, not refused by http.client."""
    if _PLAIN.fullmatch(target):
        return target
    return _OTHER.sub(lambda m: "".join(f"%{b:02X}" for b in m.group().encode("utf-8", "surrogatepass")), target)


_context: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    """The system's CA certificates and host name check, TLS 1.2 at least, HTTP/1.1 by ALPN (urllib3's defaults);
    made once, when the first https server is met."""
    global _context
    if _context is None:
        context = ssl.create_default_context()
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        _context = context
    return _context
