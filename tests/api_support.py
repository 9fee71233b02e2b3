"""The API under test: ``comfysup.api`` served in a thread of the test's process on a free loopback port, and a
stand-in runner that claims and completes jobs through the queue (the API's side of a job is the queue's rows;
the runner itself is tested against fake_comfy elsewhere)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import tomli_w

from comfysup.api.serve import serve
from comfysup.config import Config, load_config
from comfysup.queue import open_queue
from comfysup.queue.base import Output


def api_config(tmp: Path, **api: Any) -> Config:
    doc = {"queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "store")},
           "comfyui": {"gpus": "cpu:1"}, "api": {"listen": "127.0.0.1:0", **api}}
    path = tmp / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return load_config(str(path), env={})


@contextmanager
def running_api(config: Config) -> Iterator[str]:
    """The API's base URL (``http://127.0.0.1:<port>``) while the block runs; stopped and joined after it."""
    bound: list[int] = []
    ready = threading.Event()
    box: dict[str, Any] = {}

    def main() -> None:
        async def go() -> None:
            box["stop"] = asyncio.Event()
            box["loop"] = asyncio.get_running_loop()
            await serve(config, on_bound=lambda port: (bound.append(port), ready.set()), stop=box["stop"])
        try:
            asyncio.run(go())
        finally:
            ready.set()

    thread = threading.Thread(target=main, name="api-under-test", daemon=True)
    thread.start()
    assert ready.wait(20) and bound, "the API did not start"
    try:
        yield f"http://127.0.0.1:{bound[0]}"
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(20)


class StandInRunner:
    """Claims jobs and completes each with one PNG-named file in the result store, as a runner would."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.queue = open_queue(config, create=True)
        self.store = config.resolve(config.store.dir)

    def claim(self) -> Any:
        return self.queue.claim("host/1/gpu0/t", "gpu0", 60.0)

    def complete(self, claim: Any, data: bytes = b"\x89PNG fake image bytes" * 10,
                 name: str = "comfysup_00001_.png") -> bytes:
        folder = self.store / claim.id
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
        self.queue.complete(claim, [Output(name, len(data), hashlib.sha256(data).hexdigest(), str(folder / name))])
        return data

    def run_one(self) -> bytes | None:
        claim = self.claim()
        return None if claim is None else self.complete(claim)

    def close(self) -> None:
        self.queue.close()
