"""The aiohttp server: its life cycle (bind, start, stop), the worker that runs queued prompts one at a time, and
the route table. The handlers are in routes.py; they follow ComfyUI's server.py line by line where the answer
depends on it: `await request.json()` unguarded (so a non-JSON body is aiohttp's plain-text 500),
`"prompt" in json_data` on whatever JSON arrived (so a JSON array is no_prompt), the prompt counter advanced before
validation (so rejected posts consume numbers), empty 200 bodies for the POST routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web

from . import v038_jobs
from .executor import Executor
from .hostile_serve import Hostility
from .hub import Hub
from .nodes import Catalogue
from .options import Options
from .prompt_queue import PromptQueue, QueueItem
from .routes import Routes
from .script import Script
from .stats import Recorder
from .v038 import Version

#: The client id of the prompts --busy queues.
BUSY_CLIENT_ID = "fake-comfy-busy-client"
MAX_UPLOAD_SIZE = 100 * 1024 * 1024


class CannotBind(OSError):
    """A --listen address cannot be bound, usually a taken port (ComfyUI exits 1 then; so does the fake)."""


def trivial_prompt(color: int, prefix: str) -> dict[str, Any]:
    """The recorded trivial workflow (EmptyImage -> ImageInvert -> SaveImage)."""
    return {
        "1": {
            "class_type": "EmptyImage",
            "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color},
        },
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": prefix}},
    }


def bind_sockets(hosts: list[str], port: int) -> list[socket.socket]:
    """Listening sockets for every --listen address; with port 0 they share the first one's port."""
    bound: list[socket.socket] = []
    try:
        for host in hosts:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                message = f"error while attempting to bind on address {address}: {exc.strerror}"
                raise CannotBind(exc.errno, message) from exc
            port = sock.getsockname()[1]
            sock.listen(128)
            sock.setblocking(False)
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


class FakeServer:
    """One fake ComfyUI inside an event loop; `start()` and `stop()` are awaited in that loop."""

    def __init__(
        self,
        options: Options,
        *,
        recorder: Recorder | None = None,
        script: Script | None = None,
        crash: Callable[[], None],
    ) -> None:
        self.options = options
        self.recorder = recorder or Recorder(options.exec_log)
        self.script = script or Script(options.script, file=options.script_file)
        self.catalogue = Catalogue(options.input_dir, options)
        self.hub = Hub()
        self.queue = PromptQueue(self._queue_updated, options.max_history,
                                 on_withdrawn=lambda item: self.script.give_back(item.prompt_id))
        self.executor = Executor(options, self.hub, self.recorder, crash)
        self.hostility = Hostility(options, self.recorder, self.queue)
        self.version = Version(self)
        self.hub.rewrite = self._ws_frames
        self.number = 0
        self.port: int | None = None
        self._wake = asyncio.Event()
        self._free: dict[str, bool] | None = None
        self._runner: web.AppRunner | None = None
        self._worker: asyncio.Task[None] | None = None
        self._server_entry: dict[str, Any] | None = None
        self.app = self._make_app()

    def _ws_frames(self, event: str, data: Any) -> list[str | bytes] | None:
        """Hostile frames, or (0.38) the message as that version words it, or None: the hub sends it as is."""
        changed = self.version.ws_message(event, data)
        frames = self.hostility.ws_frames(event, changed)
        if frames is None and changed is not data:
            return [json.dumps({"type": event, "data": changed})]
        return frames

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind, serve, start the worker; returns the port. Raises CannotBind when it cannot listen."""
        self._prepare_directories()
        self.version.starting()  # 0.38: the assets database's lock, before the port (as main.py does)
        sockets = bind_sockets(self.options.listen.split(","), self.options.port)
        self._runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)
        try:
            await self._runner.setup()
            for sock in sockets:
                await web.SockSite(self._runner, sock).start()
        except BaseException:
            for sock in sockets:
                sock.close()
            self.version.stopped()
            raise
        self.port = sockets[0].getsockname()[1]
        self.hub.start()
        self._worker = asyncio.get_running_loop().create_task(self._work())
        self._server_entry = self.recorder.server_started(self.port)
        for i in range(self.options.busy):
            self._queue_busy(i + 1)
        return self.port

    async def stop(self, abrupt: bool = False) -> None:
        """Close everything; `abrupt` aborts connections as a killed process would (used by "crash")."""
        self.hub.close_all(abort=abrupt)
        if abrupt and self._runner is not None and self._runner.server is not None:
            for handler in self._runner.server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        await self.hub.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._server_entry is not None:
            self.recorder.server_ended(self._server_entry, crashed=abrupt)
        self.version.stopped()

    def _prepare_directories(self) -> None:
        """ComfyUI empties its temp folder at start and makes sure output and input exist."""
        shutil.rmtree(self.options.temp_dir, ignore_errors=True)
        self.options.output_dir.mkdir(parents=True, exist_ok=True)
        self.options.input_dir.mkdir(parents=True, exist_ok=True)

    def _queue_busy(self, index: int) -> None:
        """A prompt from another client that hangs until interrupted or deleted (--busy)."""
        prompt_id = f"fake-busy-{index}"
        item = QueueItem(
            self.number,
            prompt_id,
            trivial_prompt(index, "fake_busy"),
            {"client_id": BUSY_CLIENT_ID},
            ["3"],
            word="hang",
        )
        self.recorder.busy(prompt_id, self.number)
        self.number += 1
        self.queue.put(item)

    # -- worker -----------------------------------------------------------------------------------

    def _queue_updated(self) -> None:
        """ComfyUI's queue_updated: a status broadcast (and, here, a nudge for the worker)."""
        self.hub.post("status", {"status": self.queue.queue_info()})
        self._wake.set()

    async def _work(self) -> None:
        """prompt_worker: one prompt at a time, lowest number first."""
        while True:
            if self._free is not None:
                self.executor.free(**self._free)
                self._free = None
            item = self.queue.get()
            if item is not None and self.version.evicts_cache():
                self.executor.cache.clear()
            if item is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            await self._run(item)

    async def _run(self, item: QueueItem) -> None:
        """Execute, wait the history gap, write the history, then executing{node: null} as ComfyUI does."""
        ended = await self.executor.execute(item)
        if ended.outcome == "success":
            self.recorder.completed(ended.record)
        await asyncio.sleep(max(self.options.history_delay_ms, 0) / 1000)
        self.queue.task_done(item, self.version.history_result(ended.result), ended.status)
        if item.client_id is not None:
            self.hub.post("executing", {"node": None, "prompt_id": item.prompt_id}, item.client_id)
        self.version.ended(item.prompt_id)
        self.recorder.ended(ended.record, ended.outcome)
        if self.options.history_delay_ms <= 0:  # a delay asked for is the test's own, never taken off
            self.executor.ended(ended)

    # -- routes -----------------------------------------------------------------------------------

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_UPLOAD_SIZE, middlewares=[self.hostility.middleware])
        routes = Routes(self)
        table: list[tuple[str, str, Callable[[web.Request], Any]]] = [
            ("GET", "/ws", routes.websocket),
            ("GET", "/", routes.root),
            ("GET", "/embeddings", routes.empty_list),
            ("GET", "/extensions", routes.empty_list),
            ("GET", "/models", routes.models),
            ("GET", "/models/{folder}", routes.models_in_folder),
            ("GET", "/view", routes.view),
            ("GET", "/system_stats", routes.system_stats),
            ("GET", "/features", routes.features),
            ("GET", "/prompt", routes.get_prompt),
            ("POST", "/prompt", routes.post_prompt),
            ("GET", "/object_info", routes.object_info),
            ("GET", "/object_info/{node_class}", routes.object_info_node),
            ("GET", "/history", routes.get_history),
            ("GET", "/history/{prompt_id}", routes.get_history_prompt),
            ("GET", "/queue", routes.get_queue),
            ("POST", "/queue", routes.post_queue),
            ("POST", "/interrupt", routes.post_interrupt),
            ("POST", "/free", routes.post_free),
            ("POST", "/history", routes.post_history),
            ("POST", "/upload/image", routes.upload_image),
            ("POST", "/upload/mask", routes.upload_mask),
            ("GET", "/fake/stats", routes.fake_stats),
            ("POST", "/fake/control", routes.fake_control),
        ]
        for method, path, handler in table:  # ComfyUI adds the /api copies first
            app.router.add_route(method, "/api" + path, handler)
        for method, path, handler in table:
            app.router.add_route(method, path, handler)
        for method, path, handler in v038_jobs.routes(self):  # 0.38's /api/jobs
            app.router.add_route(method, path, handler)
        app.router.add_get("/{tail:.*}", routes.not_found)  # the web root's static handler
        return app

    def request_free(self, unload_models: bool, free_memory: bool) -> None:
        """POST /free: flags the worker applies before its next prompt (at once when idle), merged with any
        not yet applied."""
        pending = self._free or {"unload_models": False, "free_memory": False}
        self._free = {
            "unload_models": pending["unload_models"] or unload_models,
            "free_memory": pending["free_memory"] or free_memory,
        }
        self.recorder.event("frees", unload_models=unload_models, free_memory=free_memory)
        self._wake.set()
