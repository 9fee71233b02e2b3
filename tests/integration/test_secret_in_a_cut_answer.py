"""A 5xx body cut at 300 characters once left the first characters of an ``api_key_comfy_org`` in
the job's reason, and from there in show, status --json, results --csv, the JSON log and the webhook body.
Here a server echoes the request into its 500 so that the cut lands in the middle of the key."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import threading
from pathlib import Path

import pytest
from aiohttp import web

from comfysup.logs import JsonFormatter
from comfysup.observability.webhooks import record_body
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config

KEY = "sk-comfy-" + "0123456789abcdefABCDEF" * 2


class Echo500:
    """A ComfyUI whose POST /prompt answers 500 with the request echoed after padding, so that the first line
    of the body, cut at 300 characters, ends inside the key; a WebSocket that accepts and stays quiet."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/ws", self.ws)
        app.router.add_get("/queue", self.queue)
        app.router.add_get("/history/{id}", self.history)
        app.router.add_post("/prompt", self.prompt)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        self.loop.run_forever()

    async def queue(self, request: web.Request) -> web.Response:
        return web.json_response({"queue_running": [], "queue_pending": []})

    async def history(self, request: web.Request) -> web.Response:
        return web.json_response({})

    async def ws(self, request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse()
        await socket.prepare(request)
        async for _ in socket:
            pass
        return socket

    async def prompt(self, request: web.Request) -> web.Response:
        text = await request.text()
        at = text.index(KEY)
        body = ("E" * 300 + text[:at])[-285:] + text[at:]  # the key from the 286th character: a cut at 300 keeps 15
        return web.Response(status=500, text=body)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def fragments(text: str) -> list[str]:
    return [KEY[i:i + 8] for i in range(len(KEY) - 7) if KEY[i:i + 8] in text]


@pytest.mark.timeout(60)
def test_no_fragment_of_the_key_anywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    server = Echo500()
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    handler.setFormatter(JsonFormatter())
    logging.getLogger("comfysup").addHandler(handler)
    try:
        config = write_config(tmp_path, attempts=1)
        queue = submit(config, [trivial_job(1, extra_data={"api_key_comfy_org": KEY})])
        Runner(config_of(config), "cpu0", f"http://127.0.0.1:{server.port}", RunnerOptions(until_empty=True)).run()
    finally:
        logging.getLogger("comfysup").removeHandler(handler)
        server.stop()
    job = queue.reads.get(job_id(1))
    assert job.state == "dead" and "POST /prompt 500" in (job.reason or ""), job.reason
    assert job.reason.endswith('"api_key_comfy_org":"***')  # the cut landed inside the key: masked
    from comfysup.cli import main
    outputs = {"reason": job.reason or "", "log": log.getvalue(), "webhook": json.dumps(record_body(job))}
    for name, args in (("show", ["show", job_id(1)]), ("status", ["status", "--json"]),
                       ("results", ["results", "--csv"])):
        capsys.readouterr()
        assert main([args[0], "--config", str(config), *args[1:]]) == 0
        outputs[name] = capsys.readouterr().out
    assert {name: fragments(text) for name, text in outputs.items()} == {name: [] for name in outputs}
    assert "dead" in outputs["show"] and job_id(1) in outputs["results"]
