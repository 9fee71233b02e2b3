"""ComfyUI's frontend in headless chromium, converting UI workflows with its own ``app.graphToPrompt()``.

The frontend is the built one that ComfyUI serves (the ``comfyui-frontend-package`` distribution). A small
aiohttp server serves its static files and fakes the endpoints the page asks for at start-up, answering
``/api/object_info`` from a recorded node catalogue; nothing else of ComfyUI runs. Needs the frontend package,
selenium and Debian's ``chromium`` + ``chromium-driver``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

# What ComfyUI 0.3.64 answered to the start-up requests of a fresh user (recorded from a CPU-only server).
_FIXED: dict[str, Any] = {
    "/api/users": {"storage": "server", "migrated": True},
    "/api/settings": {"Comfy.TutorialCompleted": True},
    "/api/extensions": [],
    "/api/embeddings": [],
    "/api/features": {"supports_preview_metadata": True, "max_upload_size": 104857600},
    "/api/i18n": {},
    "/api/workflow_templates": {},
    "/api/experiment/models": [],
    "/api/models": [],
    "/api/queue": {"queue_running": [], "queue_pending": []},
    "/api/history": {},
    "/api/system_stats": {
        "system": {"os": "posix", "comfyui_version": "0.3.64", "required_frontend_version": "1.27.10",
                   "python_version": "3.11", "pytorch_version": "2.13.0+cpu", "embedded_python": False,
                   "argv": ["main.py", "--cpu"], "ram_total": 1 << 34, "ram_free": 1 << 33},
        "devices": [{"name": "cpu", "type": "cpu", "index": None, "vram_total": 0, "vram_free": 0,
                     "torch_vram_total": 0, "torch_vram_free": 0}],
    },
}


def available() -> str | None:
    """Why the frontend cannot be driven here, or None when it can."""
    try:
        import comfyui_frontend_package  # noqa: F401  (optional: recording tooling only)
        import selenium  # noqa: F401
    except ImportError as missing:
        return f"{missing.name} is not installed"
    for tool in (CHROMIUM, CHROMEDRIVER):
        if not Path(tool).exists() and shutil.which(Path(tool).name) is None:
            return f"{tool} is not installed (apt-get install chromium chromium-driver)"
    return None


def static_root() -> Path:
    import comfyui_frontend_package  # optional: only the recording tooling needs the built frontend

    return Path(comfyui_frontend_package.__file__).parent / "static"


def _app(object_info: Mapping[str, Any], root: Path, unknown: list[str]) -> web.Application:
    async def fixed(request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == "/api/object_info":
            return web.json_response(object_info)
        if path in _FIXED:
            return web.json_response(_FIXED[path])
        if path.startswith("/api/settings/"):
            return web.json_response(None)
        if path.startswith("/api/userdata"):
            return web.Response(status=404, text="Directory not found")
        if path in ("/ws", "/api/ws"):
            socket_ = web.WebSocketResponse()
            await socket_.prepare(request)
            await socket_.send_json({"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}},
                                                                  "sid": "recorder"}})
            async for _ in socket_:
                pass
            return socket_
        file = (root / path.lstrip("/")) if path != "/" else root / "index.html"
        if file.is_file() and root in file.resolve().parents:
            return web.FileResponse(file)
        unknown.append(path)
        return web.json_response({}, status=200 if path.startswith("/api/") else 404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fixed)
    return app


@contextmanager
def serve(object_info: Mapping[str, Any]) -> Iterator[str]:
    """The frontend and its fake back end on 127.0.0.1; yields the page's URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(object_info, static_root(), []))
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


_CONVERT = """
const [workflow, done] = arguments;
(async () => {
  try {
    Math.random = () => 0;  // dynamic prompts: the first option, as the tests choose
    await window.app.loadGraphData(workflow, true, false, null);
    const result = await window.app.graphToPrompt();
    done(JSON.stringify({output: result.output}));
  } catch (error) {
    done(JSON.stringify({error: String(error && error.stack || error)}));
  }
})();
"""


class Frontend:
    """One headless chromium page with ComfyUI's frontend loaded; ``prompt(workflow)`` converts one."""

    def __init__(self, url: str) -> None:
        from selenium import webdriver  # optional: only the recording tooling drives a browser
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.support.ui import WebDriverWait

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1280,900"):
            options.add_argument(flag)
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_script_timeout(60)
        self.driver.get(url)
        WebDriverWait(self.driver, 90).until(
            lambda d: d.execute_script("return !!(window.app && window.app.graph && window.app.vueAppReady !== false)"))

    def prompt(self, workflow: Mapping[str, Any]) -> dict[str, Any]:
        """What ``app.graphToPrompt()`` gives for ``workflow`` after ``app.loadGraphData``: its ``output``."""
        answer = json.loads(self.driver.execute_async_script(_CONVERT, json.loads(json.dumps(workflow))))
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return answer["output"]

    def close(self) -> None:
        self.driver.quit()


@contextmanager
def frontend(object_info: Mapping[str, Any]) -> Iterator[Frontend]:
    with serve(object_info) as url:
        page = Frontend(url)
        try:
            yield page
        finally:
            page.close()
