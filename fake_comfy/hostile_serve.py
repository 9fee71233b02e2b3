"""Hostile mode at the edge: which prompt faces which mutation, and how a mangled answer is sent.

`Hostility` belongs to one server. `assign` is called for every post with the script's word: a word
`hostile:NAME` gives the prompt that mutation, and with `Options.hostile_seed` set a prompt whose word
is "ok" may be given one at random (hostile.choose). The aiohttp middleware then mangles the answers
that concern such a prompt (hostile.WHERE), and the Hub asks `ws_frames` before sending a message.
With no hostile prompt the middleware hands every answer on untouched, so normal answers stay byte
for byte what they were. Every mangled answer counts as a hit in the prompt's stats.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from .hostile import ONCE, PREFIX, TRICKLE, Mutation, Raw, _mangle, choose, mutation_of

if TYPE_CHECKING:
    from .options import Options
    from .prompt_queue import PromptQueue
    from .stats import Recorder

ROUTES = {
    ("POST", "/prompt"): "post",
    ("GET", "/history"): "history",
    ("GET", "/history/{prompt_id}"): "history",
    ("GET", "/queue"): "queue",
    ("GET", "/system_stats"): "system_stats",
    ("GET", "/object_info"): "object_info",
    ("GET", "/object_info/{node_class}"): "object_info",
    ("GET", "/view"): "view",
}


async def send_raw(request: web.Request, raw: Raw, options: Options) -> web.StreamResponse:
    """Send `raw` as it is; past options.hostile_cap_s or hostile_cap_bytes the connection is dropped."""
    response = web.StreamResponse(headers={"Content-Type": raw.content_type})
    if not raw.endless:  # the declared length, or the honest one
        response.content_length = raw.length if raw.length is not None else len(raw.head)
    pause = options.hostile_trickle_s if raw.pause_s == TRICKLE else raw.pause_s
    await response.prepare(request)
    sent, complete = 0, False
    try:
        async with asyncio.timeout(options.hostile_cap_s):
            for chunk in raw.chunks():
                if sent >= options.hostile_cap_bytes:
                    break
                if pause > 0 and sent:
                    await asyncio.sleep(pause)
                await response.write(chunk)
                sent += len(chunk)
            else:
                complete = True
    except (TimeoutError, ConnectionError):
        pass
    if raw.abort or not complete:
        if request.transport is not None:
            request.transport.abort()
    else:
        with contextlib.suppress(ConnectionError):
            await response.write_eof()
    return response


class Hostility:
    """The mutations of one server's prompts (forgotten at a restart, like its queue and history)."""

    def __init__(self, options: Options, recorder: Recorder, queue: PromptQueue) -> None:
        self.options = options
        self.recorder = recorder
        self.queue = queue
        self.by_prompt: dict[str, Mutation] = {}
        """Bounded (oldest forgotten first) so that days of seeded chaos do not grow the fake."""
        self.armed: dict[str, deque[str]] = {where: deque(maxlen=1000) for where in ONCE}

    def assign(self, prompt_id: str, word: str) -> str:
        """The word this post runs with; records (and arms) the prompt's mutation if it has one."""
        source = "script"
        if word == "ok" and self.options.hostile_seed is not None:
            name = choose(self.options.hostile_seed, self.options.hostile_rate, prompt_id,
                          self.options.hostile_only or None)
            if name is not None:
                word, source = PREFIX + name, "seed"
        mutation = mutation_of(word)
        if mutation is None:
            self.by_prompt.pop(prompt_id, None)
            return word
        self.by_prompt.pop(prompt_id, None)
        self.by_prompt[prompt_id] = mutation
        while len(self.by_prompt) > 2 * self.options.max_history + 1000:
            del self.by_prompt[next(iter(self.by_prompt))]
        if mutation.where in ONCE:
            self.armed[mutation.where].append(prompt_id)
        self.recorder.hostile(prompt_id, mutation.name, mutation.where, source)
        return word

    # -- HTTP -------------------------------------------------------------------------------------

    @web.middleware
    async def middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        response = await handler(request)
        if not self.by_prompt:
            return response
        resource = request.match_info.route.resource
        path = resource.canonical if resource is not None else ""
        where = ROUTES.get((request.method, path.removeprefix("/api")))
        if where is None or response.status != 200:
            return response
        if where == "view":
            return await self._view(request, response)
        if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
            return response
        body: Any = json.loads(response.body)
        targets = self._targets(where, body)
        if not targets:
            return response
        for prompt_id, fn in targets:
            self.recorder.hostile_hit(prompt_id, f"{request.method} {request.path}")
            body = fn(body, prompt_id)
            if isinstance(body, Raw):
                return await send_raw(request, body, self.options)
        return web.json_response(body)

    def _targets(self, where: str, body: Any) -> list[tuple[str, Callable[[Any, str], Any]]]:
        """(prompt id, fn(body, prompt_id)) for each mutation this answer meets."""
        if where in ONCE:
            armed = self.armed[where]
            if not armed:
                return []
            prompt_id = armed.popleft()
            return [(prompt_id, self.by_prompt[prompt_id].fn)] if prompt_id in self.by_prompt else []
        if where == "post":
            prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
            mutation = self.by_prompt.get(prompt_id) if isinstance(prompt_id, str) else None
            return [(prompt_id, mutation.fn)] if mutation is not None and mutation.where == "post" else []
        found: list[tuple[str, Callable[[Any, str], Any]]] = []
        for prompt_id in body if isinstance(body, dict) else ():
            mutation = self.by_prompt.get(prompt_id)
            if mutation is not None and mutation.where == "history":
                found.append((prompt_id, mutation.fn))
            elif mutation is not None and mutation.where == "names":
                found.append((prompt_id, self._renamer(mutation)))
        return found

    @staticmethod
    def _renamer(mutation: Mutation) -> Callable[[Any, str], Any]:
        def rename(body: Any, prompt_id: str) -> Any:
            return _mangle(body, "@.outputs.*.images.*", prompt_id, mutation.fn)

        return rename

    async def _view(self, request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        """/view of a file that a prompt with a view mutation wrote (found through its history entry)."""
        query = request.rel_url.query
        key = (query.get("filename"), query.get("subfolder", ""), query.get("type", "output"))
        for prompt_id, mutation in self.by_prompt.items():
            entry = self.queue.history.get(prompt_id) if mutation.where == "view" else None
            outputs = entry.get("outputs", {}) if entry else {}
            images = [i for o in outputs.values() for i in o.get("images", [])]
            if any((i["filename"], i["subfolder"], i["type"]) == key for i in images):
                folder = self.options.directory_for_type(key[2])
                if folder is None or key[0] is None:
                    break
                content = (Path(folder) / key[1] / key[0]).read_bytes()
                self.recorder.hostile_hit(prompt_id, f"{request.method} {request.path}")
                return await send_raw(request, mutation.fn(content), self.options)
        return response

    # -- WebSocket --------------------------------------------------------------------------------

    def ws_frames(self, event: str, data: Any) -> list[str | bytes] | None:
        """The frames to send instead of this message, or None to send it as it is."""
        if not self.by_prompt or not isinstance(data, dict):
            return None
        prompt_id = data.get("prompt_id")
        mutation = self.by_prompt.get(prompt_id) if isinstance(prompt_id, str) else None
        frames = None
        if mutation is not None and mutation.where == "ws":
            frames = mutation.fn(event, data)
        elif mutation is not None and mutation.where == "names" and event == "executed":
            renamed = _mangle({"type": event, "data": data}, "data.output.images.*", "", mutation.fn)
            frames = [json.dumps(renamed)]
        if frames is not None and isinstance(prompt_id, str):
            self.recorder.hostile_hit(prompt_id, f"ws {event}")
        return frames
