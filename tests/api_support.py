"""The API under test: ``comfysup.api`` served in a thread of the test's process on a free loopback port, and a
stand-in runner that claims and completes jobs through the queue (the API's side of a job is the queue's rows;
the runner itself is tested against fake_comfy elsewhere)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from aiohttp import web

from comfysup.api.serve import serve
from comfysup.config import Config, load_config
from comfysup.queue import open_queue
from comfysup.queue.base import Output


def api_config(tmp: Path, sections: dict[str, dict[str, Any]] | None = None, queue_url: str = "",
               **api: Any) -> Config:
    """A config in ``tmp`` serving the API on a free loopback port, over SQLite in ``tmp`` (or the PostgreSQL at
    ``queue_url``); ``sections`` adds or replaces other tables."""
    queue = {"url": queue_url} if queue_url else {"path": str(tmp / "queue.db")}
    doc = {"queue": queue, "store": {"dir": str(tmp / "store")},
           "comfyui": {"gpus": "cpu:1"}, "api": {"listen": "127.0.0.1:0", **api}, **(sections or {})}
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return load_config(str(path), env={})


@contextmanager
def running_api(config: Config) -> Iterator[str]:
    """The API's base URL (``http://127.0.0.1:<port>``) while the block runs; stopped and joined after it."""
    with running_api_app(config) as (url, _app):
        yield url


@contextmanager
def running_api_app(config: Config) -> Iterator[tuple[str, web.Application]]:
    """The API's base URL and its application (its state, its event watcher) while the block runs."""
    bound: list[int] = []
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        async def go() -> None:
            box["stop"] = asyncio.Event()
            box["loop"] = asyncio.get_running_loop()
            await serve(config, on_bound=lambda port: (bound.append(port), ready.set()), stop=box["stop"],
                        on_app=lambda app: box.update(app=app))
        try:
            asyncio.run(go())
        finally:
            ready.set()

    thread = threading.Thread(target=main, name="api-under-test", daemon=True)
    thread.start()
    assert ready.wait(20) and bound, "the API did not start"
    try:
        yield f"http://127.0.0.1:{bound[0]}", box["app"]
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(20)


class StandInRunner:
    """Claims jobs as ``machine`` and completes each with one PNG-named file in the result store, as a runner
    would."""

    def __init__(self, config: Config, machine: str = "host") -> None:
        self.config = config
        self.queue = open_queue(config, create=True)
        self.store = config.resolve(config.store.dir)
        self.machine = machine
        """The host part of its claims' owner: the machine a done job names as the holder of its files."""

    def claim(self) -> Any:
        return self.queue.leases.claim(f"{self.machine}/1/gpu0/t", "gpu0", 60.0)

    def complete(self, claim: Any, data: bytes = b"\x89PNG fake image bytes" * 10,
                 name: str = "comfysup_00001_.png") -> bytes:
        folder = self.store / claim.id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        output = Output(name, len(data), hashlib.sha256(data).hexdigest(), str(folder / name))
        self.queue.leases.complete(claim, [output])
        return data

    def run_one(self) -> bytes | None:
        claim = self.claim()
        return None if claim is None else self.complete(claim)

    def close(self) -> None:
        self.queue.close()


def working(runner: StandInRunner, stop: threading.Event) -> threading.Thread:
    """A thread that runs queued jobs with ``runner`` until ``stop`` is set."""
    def loop() -> None:
        while not stop.is_set():
            if runner.run_one() is None:
                time.sleep(0.05)
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, StandInRunner, Config]]:
    """The API on a fresh SQLite queue, COMFY_BASE_URL pointing at it (as comfy-sdk reads it), and a stand-in
    runner; test modules import it by name (``from tests.api_support import api  # noqa: F401``)."""
    config = api_config(tmp_path)
    with running_api(config) as url:
        monkeypatch.setenv("COMFY_BASE_URL", url)
        monkeypatch.delenv("COMFY_API_KEY", raising=False)
        runner = StandInRunner(config)
        try:
            yield url, runner, config
        finally:
            runner.close()


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def exchange(url: str, data: bytes, timeout: float = 10.0) -> bytes:
    """``data`` sent as it is on a new connection to ``url``'s server; everything it answers until it closes (or
    until ``timeout`` passes with nothing more)."""
    with socket.create_connection(address(url), timeout=timeout) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass
    return answer


def status_of(answer: bytes) -> int:
    """The status code of a raw HTTP answer; 0 when there is none (the server closed without one)."""
    line = answer.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) >= 2 and line[1].isdigit() else 0


def trickled_until_closed(sock: socket.socket, data: bytes) -> bool:
    """Send ``data`` one byte at a time, each before a per-read timeout could pass; True once the server closes the
    connection (a deadline for the whole request head), False when all was sent and it is still open."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            return True
        if closed_within(sock, 0.2):
            return True
    return False


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` (end of file or reset) within ``seconds``; what it sends is read."""
    deadline = time.monotonic() + seconds
    try:
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        pass
    return False
