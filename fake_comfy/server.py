"""The aiohttp server: ComfyUI 0.3.64's routes with the recorded answers, a worker, start and stop.

Handlers follow ComfyUI's server.py line by line where the answer depends on it: `await
request.json()` unguarded (so a non-JSON body is aiohttp's plain-text 500), `"prompt" in json_data`
on whatever JSON arrived (so a JSON array is no_prompt), the prompt counter advanced before
validation (so rejected posts consume numbers), empty 200 bodies for the POST routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import mimetypes
import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType, web

from . import __version__, uploads
from .executor import Executor, physical_memory
from .hostile_serve import Hostility
from .hub import Hub
from .nodes import Catalogue, data
from .options import Options
from .prompt_queue import SENSITIVE_EXTRA_DATA_KEYS, PromptQueue, QueueItem
from .script import Script, check_words
from .stats import Recorder
from .v038 import INVALID_PROMPT_ID, Version
from .v038 import validate as validate_038
from .validate import scripted_invalid, validate_prompt

#: The client id of the prompts --busy queues.
BUSY_CLIENT_ID = "fake-comfy-busy-client"
MAX_UPLOAD_SIZE = 100 * 1024 * 1024
_FORCE_DOWNLOAD = {"text/html", "text/html-sandboxed", "application/xhtml+xml", "text/javascript", "text/css"}


class ScriptedServerError(Exception):
    """The "500" word: raised in the handler so aiohttp answers with its own plain-text 500."""


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


def annotated_filepath(name: str, options: Options) -> tuple[str, Path | None]:
    """folder_paths.annotated_filepath: "x.png [output]" names its folder."""
    for kind in ("output", "input", "temp"):
        suffix = f"[{kind}]"
        if name.endswith(suffix):
            return name[: -len(suffix) - 1], options.directory_for_type(kind)
    return name, None


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
        routes: list[tuple[str, str, Callable[[web.Request], Any]]] = [
            ("GET", "/ws", self.websocket),
            ("GET", "/", self.root),
            ("GET", "/embeddings", self.empty_list),
            ("GET", "/extensions", self.empty_list),
            ("GET", "/models", self.models),
            ("GET", "/models/{folder}", self.models_in_folder),
            ("GET", "/view", self.view),
            ("GET", "/system_stats", self.system_stats),
            ("GET", "/features", self.features),
            ("GET", "/prompt", self.get_prompt),
            ("POST", "/prompt", self.post_prompt),
            ("GET", "/object_info", self.object_info),
            ("GET", "/object_info/{node_class}", self.object_info_node),
            ("GET", "/history", self.get_history),
            ("GET", "/history/{prompt_id}", self.get_history_prompt),
            ("GET", "/queue", self.get_queue),
            ("POST", "/queue", self.post_queue),
            ("POST", "/interrupt", self.post_interrupt),
            ("POST", "/free", self.post_free),
            ("POST", "/history", self.post_history),
            ("POST", "/upload/image", self.upload_image),
            ("POST", "/upload/mask", self.upload_mask),
            ("GET", "/fake/stats", self.fake_stats),
            ("POST", "/fake/control", self.fake_control),
        ]
        for method, path, handler in routes:  # ComfyUI adds the /api copies first
            app.router.add_route(method, "/api" + path, handler)
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        for method, path, handler in self.version.routes():  # 0.38's /api/jobs
            app.router.add_route(method, path, handler)
        app.router.add_get("/{tail:.*}", self.not_found)  # the web root's static handler
        return app

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "") or uuid.uuid4().hex
        self.hub.register(sid, ws, request)
        try:
            await self.hub.send_json("status", {"status": self.queue.queue_info(), "sid": sid}, sid)
            if self.executor.client_id == sid and self.executor.last_node_id is not None:
                await self.hub.send_json("executing", {"node": self.executor.last_node_id}, sid)
            first = True
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError, AttributeError):
                    message = msg.json()
                    if first and message.get("type") == "feature_flags":
                        self.hub.metadata.setdefault(sid, {})["feature_flags"] = message.get("data", {})
                        await self.hub.send_json("feature_flags", data("system.json")["features"], sid)
                first = False
        finally:
            self.hub.unregister(sid, ws)
        return ws

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(
            text=f"<html><body>fake_comfy {__version__}</body></html>", content_type="text/html"
        )

    async def empty_list(self, request: web.Request) -> web.Response:
        return web.json_response([])

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(data("system.json")["models"])

    async def models_in_folder(self, request: web.Request) -> web.Response:
        if request.match_info["folder"] not in data("system.json")["models"]:
            return web.Response(status=404)
        return web.json_response([])

    async def not_found(self, request: web.Request) -> web.Response:
        return web.Response(status=404, content_type="application/octet-stream")

    async def upload_image(self, request: web.Request) -> web.Response:
        return await uploads.upload_image(request, self.options.directory_for_type)

    async def upload_mask(self, request: web.Request) -> web.Response:
        return await uploads.upload_mask(request, self.options.directory_for_type)

    async def view(self, request: web.Request) -> web.StreamResponse:
        """GET /view with ComfyUI's checks: '..' or a leading '/' in filename 400, escaping subfolder 403."""
        query = request.rel_url.query
        if "filename" in query:
            answer = await self._view(query)
            self.recorder.event("views", filename=query["filename"], subfolder=query.get("subfolder", ""),
                                type=query.get("type", "output"), status=answer.status)
            return answer
        return web.Response(status=404)

    async def _view(self, query: Any) -> web.StreamResponse:
        filename, folder = annotated_filepath(query["filename"], self.options)
        if not filename or filename[0] == "/" or ".." in filename:
            return web.Response(status=400)
        if folder is None:
            folder = self.options.directory_for_type(query.get("type", "output"))
        if folder is None:
            return web.Response(status=400)
        base = str(folder)
        if "subfolder" in query:
            full = os.path.join(base, query["subfolder"])
            if os.path.commonpath((os.path.abspath(full), base)) != base:
                return web.Response(status=403)
            base = full
        filename = os.path.basename(filename)
        path = os.path.join(base, filename)
        if os.path.isfile(path):
            content_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
            if content_type in _FORCE_DOWNLOAD:
                content_type = "application/octet-stream"
            headers = {"Content-Disposition": f'filename="{filename}"', "Content-Type": content_type}
            headers = self.version.view_headers(mimetypes.guess_type(filename)[0] or "", filename, headers)
            return web.FileResponse(path, headers=headers)
        return web.Response(status=404)

    async def system_stats(self, request: web.Request) -> web.Response:
        stats = data("system.json")["system_stats"]
        ram = physical_memory()
        system = {
            **stats["system"],
            "ram_total": ram,
            "ram_free": ram // 2,
            "python_version": sys.version,
            "pytorch_version": f"fake_comfy {__version__}",
            "argv": self.options.argv,
        }
        if self.options.cpu:
            device = {
                **stats["devices"][0],
                "vram_total": ram,
                "vram_free": ram // 2,
                "torch_vram_total": ram,
                "torch_vram_free": ram // 2,
            }
        else:
            vram = 24 << 30
            name = f"cuda:0 fake_comfy GPU (--cuda-device {self.options.cuda_device or 0}) : cudaMallocAsync"
            device = {
                "name": name,
                "type": "cuda",
                "index": 0,
                "vram_total": vram,
                "vram_free": vram,
                "torch_vram_total": 0,
                "torch_vram_free": 0,
            }
        return web.json_response(self.version.system_stats({"system": system, "devices": [device]}))

    async def features(self, request: web.Request) -> web.Response:
        return web.json_response(self.version.features(data("system.json")["features"]))

    async def get_prompt(self, request: web.Request) -> web.Response:
        return web.json_response(self.queue.queue_info())

    async def post_prompt(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        post = word = None
        if isinstance(json_data, dict) and "prompt" in json_data:
            checked = self.version.prompt_id(json_data)
            if checked is None:  # 0.38: not a canonical UUID; the number is taken all the same
                if "number" not in json_data:
                    self.number += 1
                return web.json_response({"error": INVALID_PROMPT_ID, "node_errors": {}}, status=400)
            prompt_id = checked
            word = self.hostility.assign(prompt_id, self.script.take(prompt_id))
            post = self.recorder.posted(prompt_id, word)
            if word == "500":
                self.recorder.answered(post, 500, None)
                raise ScriptedServerError(f"fake_comfy: scripted 500 for prompt {prompt_id}")
        if "number" in json_data:
            number = float(json_data["number"])
        else:
            number = self.number
            if "front" in json_data and json_data["front"]:  # noqa: RUF019 - json_data may be a list
                number = -number
            self.number += 1
        if post is None or word is None:
            error = {
                "type": "no_prompt",
                "message": "No prompt provided",
                "details": "No prompt provided",
                "extra_info": {},
            }
            return web.json_response({"error": error, "node_errors": {}}, status=400)
        response = self._queue_prompt(json_data, prompt_id, number, word)
        self.recorder.answered(post, response.status, number)
        return response

    def _queue_prompt(
        self, json_data: dict[str, Any], prompt_id: str, number: float, word: str
    ) -> web.Response:
        """Validate and queue (the part of post_prompt after the number is taken)."""
        prompt = json_data["prompt"]
        partial = json_data.get("partial_execution_targets")
        plain = isinstance(prompt, dict) and prompt and all(isinstance(n, dict) for n in prompt.values())
        if word == "invalid" and plain:
            valid = scripted_invalid(prompt, self.catalogue)
        elif self.version.new:
            valid = validate_038(prompt, partial, self.catalogue)
        else:
            valid = validate_prompt(prompt, partial, self.catalogue)
        extra_data = json_data.get("extra_data", {})
        if "client_id" in json_data:
            extra_data["client_id"] = json_data["client_id"]
        if not valid[0]:
            return web.json_response({"error": valid[1], "node_errors": valid[3]}, status=400)
        sensitive = {key: extra_data.pop(key) for key in SENSITIVE_EXTRA_DATA_KEYS if key in extra_data}
        if self.version.new:
            extra_data["create_time"] = int(time.time() * 1000)
        self.queue.put(QueueItem(number, prompt_id, prompt, extra_data, valid[2], sensitive, word))
        return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": valid[3]})

    async def object_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.catalogue.object_info())

    async def object_info_node(self, request: web.Request) -> web.Response:
        node = self.catalogue.get(request.match_info["node_class"])
        return web.json_response({node.name: node.info} if node is not None else {})

    async def get_history(self, request: web.Request) -> web.Response:
        max_items = request.rel_url.query.get("max_items")
        offset = request.rel_url.query.get("offset")
        history = self.queue.get_history(
            max_items=int(max_items) if max_items is not None else None,
            offset=int(offset) if offset is not None else -1,
        )
        return web.json_response(history)

    async def get_history_prompt(self, request: web.Request) -> web.Response:
        return web.json_response(self.queue.get_history(prompt_id=request.match_info["prompt_id"]))

    async def get_queue(self, request: web.Request) -> web.Response:
        running = [item.public() for item in self.queue.running.values()]
        pending = [item.public() for item in self.queue.pending]
        return web.json_response({"queue_running": running, "queue_pending": pending})

    async def post_queue(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:  # noqa: RUF019 - a JSON array answers 200, as upstream
            self.recorder.event("queue_clears", removed=self.queue.wipe_queue())
        if "delete" in json_data:
            for prompt_id in json_data["delete"]:
                self.recorder.event(
                    "queue_deletes", prompt_id=prompt_id, removed=self.queue.delete_queue_item(prompt_id)
                )
        return web.Response(status=200)

    async def post_interrupt(self, request: web.Request) -> web.Response:
        """Global, or only the given prompt_id and only if it is the running one (else ignored)."""
        try:
            json_data = await request.json()
        except ValueError:
            json_data = {}
        prompt_id = json_data.get("prompt_id")
        running = self.queue.running_ids()
        effective = prompt_id in running if prompt_id else True
        if effective:
            self.executor.interrupt()
        self.recorder.event(
            "interrupts",
            prompt_id=prompt_id,
            running=running[0] if running else None,
            effective=effective and bool(running),
        )
        return web.Response(status=200)

    async def post_free(self, request: web.Request) -> web.Response:
        """Sets flags the worker applies before its next prompt (at once when idle)."""
        json_data = await request.json()
        free_memory = bool(json_data.get("free_memory", False))
        unload_models = bool(json_data.get("unload_models", free_memory))
        pending = self._free or {"unload_models": False, "free_memory": False}
        self._free = {
            "unload_models": pending["unload_models"] or unload_models,
            "free_memory": pending["free_memory"] or free_memory,
        }
        self.recorder.event("frees", unload_models=unload_models, free_memory=free_memory)
        self._wake.set()
        return web.Response(status=200)

    async def post_history(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:  # noqa: RUF019 - a JSON array answers 200, as upstream
            self.queue.wipe_history()
        if "delete" in json_data:
            for prompt_id in json_data["delete"]:
                self.queue.delete_history_item(prompt_id)
        return web.Response(status=200)

    async def fake_stats(self, request: web.Request) -> web.Response:
        """Not ComfyUI: what the fake received and executed (see stats.Recorder)."""
        return web.json_response(self.recorder.snapshot())

    async def fake_control(self, request: web.Request) -> web.Response:
        """Not ComfyUI: change the script and knobs of a running fake (for tests that only have its URL).

        Body: any of {"script": [words], "script_by_id": {id: [words]}, "node_ms", "load_ms",
        "history_delay_ms", "hostile_seed", "hostile_rate", "hostile_trickle_s", "hostile_cap_s"};
        400 with {"error": ...} for an unknown word.
        """
        body = await request.json()
        try:
            if "script" in body:
                self.script.set_order(check_words(body["script"]))
            if "script_by_id" in body:
                self.script.set_by_id(body["script_by_id"])
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        for knob in ("node_ms", "load_ms", "history_delay_ms", "hostile_rate", "hostile_trickle_s", "hostile_cap_s"):
            if knob in body:
                setattr(self.options, knob, float(body[knob]))
        if "hostile_seed" in body:
            self.options.hostile_seed = None if body["hostile_seed"] is None else int(body["hostile_seed"])
        return web.json_response({"ok": True})
