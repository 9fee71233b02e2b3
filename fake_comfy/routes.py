"""The fake's HTTP and WebSocket routes: ComfyUI's endpoints, each answering as the recorded server does.

`Routes` holds the `FakeServer` (server.py: its queue, executor, hub and recorder, its life cycle and the worker
that runs prompts) and turns requests into calls on it; the route table is the server's `_make_app`. What a
prompt does once queued is the executor's (executor.py, nodework.py).
"""

from __future__ import annotations

import contextlib
import mimetypes
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from . import uploads
from .nodes import data
from .nodework import physical_memory
from .prompt_queue import SENSITIVE_EXTRA_DATA_KEYS, QueueItem
from .script import check_words
from .v038 import INVALID_PROMPT_ID
from .v038 import validate as validate_038
from .validate import scripted_invalid, validate_prompt
from .version import __version__

if TYPE_CHECKING:
    from .options import Options
    from .server import FakeServer

_FORCE_DOWNLOAD = {"text/html", "text/html-sandboxed", "application/xhtml+xml", "text/javascript", "text/css"}


class ScriptedServerError(Exception):
    """The "500" word: raised in the handler so aiohttp answers with its own plain-text 500."""


def annotated_filepath(name: str, options: Options) -> tuple[str, Path | None]:
    """folder_paths.annotated_filepath: "x.png [output]" names its folder."""
    for kind in ("output", "input", "temp"):
        suffix = f"[{kind}]"
        if name.endswith(suffix):
            return name[: -len(suffix) - 1], options.directory_for_type(kind)
    return name, None


class Routes:
    """ComfyUI's routes over one `FakeServer`."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server

    async def websocket(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "") or uuid.uuid4().hex
        self.server.hub.register(sid, ws, request)
        try:
            await self.server.hub.send_json("status", {"status": self.server.queue.queue_info(), "sid": sid}, sid)
            if self.server.executor.client_id == sid and self.server.executor.last_node_id is not None:
                await self.server.hub.send_json("executing", {"node": self.server.executor.last_node_id}, sid)
            first = True
            async for msg in ws:
                if msg.type != WSMsgType.TEXT:
                    continue
                with contextlib.suppress(ValueError, AttributeError):
                    message = msg.json()
                    if first and message.get("type") == "feature_flags":
                        self.server.hub.metadata.setdefault(sid, {})["feature_flags"] = message.get("data", {})
                        await self.server.hub.send_json("feature_flags", data("system.json")["features"], sid)
                first = False
        finally:
            self.server.hub.unregister(sid, ws)
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
        folder = request.match_info["folder"]
        if folder not in data("system.json")["models"]:
            return web.Response(status=404)
        return web.json_response(list((self.server.options.model_files() or {}).get(folder, [])))

    async def not_found(self, request: web.Request) -> web.Response:
        return web.Response(status=404, content_type="application/octet-stream")

    async def upload_image(self, request: web.Request) -> web.Response:
        return await uploads.upload_image(request, self.server.options.directory_for_type)

    async def upload_mask(self, request: web.Request) -> web.Response:
        return await uploads.upload_mask(request, self.server.options.directory_for_type)

    async def view(self, request: web.Request) -> web.StreamResponse:
        """GET /view with ComfyUI's checks: '..' or a leading '/' in filename 400, escaping subfolder 403."""
        query = request.rel_url.query
        if "filename" in query:
            answer = await self._view(query)
            self.server.recorder.event("views", filename=query["filename"], subfolder=query.get("subfolder", ""),
                                type=query.get("type", "output"), status=answer.status)
            return answer
        return web.Response(status=404)

    async def _view(self, query: Any) -> web.StreamResponse:
        filename, folder = annotated_filepath(query["filename"], self.server.options)
        if not filename or filename[0] == "/" or ".." in filename:
            return web.Response(status=400)
        if folder is None:
            folder = self.server.options.directory_for_type(query.get("type", "output"))
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
            headers = self.server.version.view_headers(mimetypes.guess_type(filename)[0] or "", filename, headers)
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
            "argv": self.server.options.argv,
        }
        if self.server.options.cpu:
            device = {
                **stats["devices"][0],
                "vram_total": ram,
                "vram_free": ram // 2,
                "torch_vram_total": ram,
                "torch_vram_free": ram // 2,
            }
        else:
            vram = 24 << 30
            name = f"cuda:0 fake_comfy GPU (--cuda-device {self.server.options.cuda_device or 0}) : cudaMallocAsync"
            device = {
                "name": name,
                "type": "cuda",
                "index": 0,
                "vram_total": vram,
                "vram_free": vram,
                "torch_vram_total": 0,
                "torch_vram_free": 0,
            }
        return web.json_response(self.server.version.system_stats({"system": system, "devices": [device]}))

    async def features(self, request: web.Request) -> web.Response:
        return web.json_response(self.server.version.features(data("system.json")["features"]))

    async def get_prompt(self, request: web.Request) -> web.Response:
        return web.json_response(self.server.queue.queue_info())

    async def post_prompt(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        post = word = None
        if isinstance(json_data, dict) and "prompt" in json_data:
            checked = self.server.version.prompt_id(json_data)
            if checked is None:  # 0.38: not a canonical UUID; the number is taken all the same
                if "number" not in json_data:
                    self.server.number += 1
                return web.json_response({"error": INVALID_PROMPT_ID, "node_errors": {}}, status=400)
            prompt_id = checked
            word = self.server.hostility.assign(prompt_id, self.server.script.take(prompt_id))
            post = self.server.recorder.posted(prompt_id, word)
            if word == "500":
                self.server.recorder.answered(post, 500, None)
                raise ScriptedServerError(f"fake_comfy: scripted 500 for prompt {prompt_id}")
        if "number" in json_data:
            number = float(json_data["number"])
        else:
            number = self.server.number
            if "front" in json_data and json_data["front"]:  # noqa: RUF019 - json_data may be a list
                number = -number
            self.server.number += 1
        if post is None or word is None:
            error = {
                "type": "no_prompt",
                "message": "No prompt provided",
                "details": "No prompt provided",
                "extra_info": {},
            }
            return web.json_response({"error": error, "node_errors": {}}, status=400)
        response = self.queue_prompt(json_data, prompt_id, number, word)
        self.server.recorder.answered(post, response.status, number)
        return response

    def queue_prompt(
        self, json_data: dict[str, Any], prompt_id: str, number: float, word: str
    ) -> web.Response:
        """Validate and queue (the part of post_prompt after the number is taken)."""
        prompt = json_data["prompt"]
        partial = json_data.get("partial_execution_targets")
        plain = isinstance(prompt, dict) and prompt and all(isinstance(n, dict) for n in prompt.values())
        if word == "invalid" and plain:
            valid = scripted_invalid(prompt, self.server.catalogue)
        elif self.server.version.new:
            valid = validate_038(prompt, partial, self.server.catalogue)
        else:
            valid = validate_prompt(prompt, partial, self.server.catalogue)
        extra_data = json_data.get("extra_data", {})
        if "client_id" in json_data:
            extra_data["client_id"] = json_data["client_id"]
        if not valid[0]:
            return web.json_response({"error": valid[1], "node_errors": valid[3]}, status=400)
        sensitive = {key: extra_data.pop(key) for key in SENSITIVE_EXTRA_DATA_KEYS if key in extra_data}
        if self.server.version.new:
            extra_data["create_time"] = int(time.time() * 1000)
        self.server.queue.put(QueueItem(number, prompt_id, prompt, extra_data, valid[2], sensitive, word))
        return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": valid[3]})

    async def object_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server.catalogue.object_info())

    async def object_info_node(self, request: web.Request) -> web.Response:
        node = self.server.catalogue.get(request.match_info["node_class"])
        return web.json_response({node.name: node.info} if node is not None else {})

    async def get_history(self, request: web.Request) -> web.Response:
        max_items = request.rel_url.query.get("max_items")
        offset = request.rel_url.query.get("offset")
        history = self.server.queue.get_history(
            max_items=int(max_items) if max_items is not None else None,
            offset=int(offset) if offset is not None else -1,
        )
        return web.json_response(history)

    async def get_history_prompt(self, request: web.Request) -> web.Response:
        return web.json_response(self.server.queue.get_history(prompt_id=request.match_info["prompt_id"]))

    async def get_queue(self, request: web.Request) -> web.Response:
        running = [item.public() for item in self.server.queue.running.values()]
        pending = [item.public() for item in self.server.queue.pending]
        return web.json_response({"queue_running": running, "queue_pending": pending})

    async def post_queue(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:  # noqa: RUF019 - a JSON array answers 200, as upstream
            self.server.recorder.event("queue_clears", removed=self.server.queue.wipe_queue())
        if "delete" in json_data:
            for prompt_id in json_data["delete"]:
                self.server.recorder.event(
                    "queue_deletes", prompt_id=prompt_id, removed=self.server.queue.delete_queue_item(prompt_id)
                )
        return web.Response(status=200)

    async def post_interrupt(self, request: web.Request) -> web.Response:
        """Global, or only the given prompt_id and only if it is the running one (else ignored)."""
        try:
            json_data = await request.json()
        except ValueError:
            json_data = {}
        prompt_id = json_data.get("prompt_id")
        running = self.server.queue.running_ids()
        effective = prompt_id in running if prompt_id else True
        if effective:
            self.server.executor.interrupt()
        self.server.recorder.event(
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
        self.server.request_free(unload_models, free_memory)
        return web.Response(status=200)

    async def post_history(self, request: web.Request) -> web.Response:
        json_data = await request.json()
        if "clear" in json_data and json_data["clear"]:  # noqa: RUF019 - a JSON array answers 200, as upstream
            self.server.queue.wipe_history()
        if "delete" in json_data:
            for prompt_id in json_data["delete"]:
                self.server.queue.delete_history_item(prompt_id)
        return web.Response(status=200)

    async def fake_stats(self, request: web.Request) -> web.Response:
        """Not ComfyUI: what the fake received and executed (see stats.Recorder)."""
        return web.json_response(self.server.recorder.snapshot())

    async def fake_control(self, request: web.Request) -> web.Response:
        """Not ComfyUI: change the script and knobs of a running fake (for tests that only have its URL).

        Body: any of {"script": [words], "script_by_id": {id: [words]}, "node_ms", "load_ms", "step_ms",
        "history_delay_ms", "hostile_seed", "hostile_rate", "hostile_trickle_s", "hostile_cap_s"};
        400 with {"error": ...} for an unknown word.
        """
        body = await request.json()
        try:
            if "script" in body:
                self.server.script.set_order(check_words(body["script"]))
            if "script_by_id" in body:
                self.server.script.set_by_id(body["script_by_id"])
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        for knob in ("node_ms", "load_ms", "step_ms", "history_delay_ms", "hostile_rate", "hostile_trickle_s",
                     "hostile_cap_s"):
            if knob in body:
                setattr(self.server.options, knob, float(body[knob]))
        if "hostile_seed" in body:
            self.server.options.hostile_seed = None if body["hostile_seed"] is None else int(body["hostile_seed"])
        return web.json_response({"ok": True})
