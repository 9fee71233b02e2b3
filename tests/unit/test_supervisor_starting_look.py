"""The supervisor's look between ticks while a launched server starts: which servers it looks at, and that a
refused port is no answer while an answering /system_stats is one."""

from __future__ import annotations

import http.server
import socket
import threading
from types import SimpleNamespace

from comfysup.supervisor.policy import State
from comfysup.supervisor.serving import ServerDriver


def unit(state: State, pid: int | None = 1, warm_since: float | None = None, url: str = "") -> SimpleNamespace:
    return SimpleNamespace(server=SimpleNamespace(state=state), server_pid=pid, warm_since=warm_since, url=url)


def driver() -> ServerDriver:
    return ServerDriver(config=None, ops=None, env={})  # type: ignore[arg-type]  # neither is used by these


def test_only_launched_servers_that_start_and_have_not_answered_are_looked_at():
    looked = unit(State.STARTING)
    others = [unit(State.STARTING, warm_since=1.0), unit(State.RUNNING), unit(State.STARTING, pid=None),
              SimpleNamespace(server=None, server_pid=None, warm_since=None, url="")]
    assert driver().awaited([looked, *others]) == [looked]


class Stats(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/system_stats" else 404)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


def test_a_refused_port_is_no_answer_and_an_answering_server_is_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        assert driver().any_answers([unit(State.STARTING, url=refused)]) is False
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stats)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        answering = f"http://127.0.0.1:{server.server_address[1]}"
        assert driver().any_answers([unit(State.STARTING, url=refused), unit(State.STARTING, url=answering)])
    finally:
        server.shutdown()
        server.server_close()
