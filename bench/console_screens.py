"""bench/console_screens.py: the screenshots of docs/console.md, taken in headless Chromium (Selenium).

An API with a token over a fresh SQLite queue, filled with what an operator sees: done jobs with an image and a
video output (the video a real WebM the browser records), dead letters with ComfyUI's traceback, running jobs
with progress on two machines' slots, an hour of ended attempts for the charts. Then each page is saved as a PNG
in docs/: the login, the overview, a search, a job, and the overview in a narrow window.

    .venv/bin/python bench/console_screens.py
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import base64
import hashlib
import random
import struct
import tempfile
import time
import zlib

from selenium import webdriver
from selenium.webdriver.chrome.service import Service

from comfysup.queue.base import Output
from tests.api_support import StandInRunner, api_config, running_api
from tests.integration.test_console_browser import RECORD_WEBM, Console, until
from tests.queue_contract import make_job

TOKEN = "screenshot-token"
DOCS = REPO / "docs"


def png(width: int, height: int, seed: int) -> bytes:
    """A gradient picture, as a PNG written with zlib alone."""
    rows = b"".join(b"\x00" + bytes(v for x in range(width) for v in (
        (x * 255 // width + seed * 40) % 256, y * 255 // height, (seed * 70 + x + y) % 256)) for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def done(c: Console, n: int, files: list[tuple[str, bytes]], at: float, workflow: str) -> str:
    job = make_job(n, meta={"team": random.choice(["red", "blue"]), "customer": f"c{n % 7}"})
    c.queue.intake.submit([job], now=at - 40)
    claim = c.queue.leases.claim("gpu-a/1/gpu0/t", "gpu0", 60.0, now=at - 30)
    folder = c.runner.store / claim.id
    folder.mkdir(parents=True, exist_ok=True)
    outputs = []
    for name, data in files:
        (folder / name).write_bytes(data)
        outputs.append(Output(name, len(data), hashlib.sha256(data).hexdigest(), str(folder / name)))
    trace = {"phases": [["claimed", at - 30], ["posted", at - 29.8], ["executing", at - 27], ["downloading", at - 2],
                        ["recorded", at]],
             "nodes": [{"id": "4", "class_type": "CheckpointLoaderSimple", "started": at - 27, "seconds": 3.1},
                       {"id": "3", "class_type": "KSampler", "started": at - 23.9, "seconds": 19.2},
                       {"id": "8", "class_type": "VAEDecode", "started": at - 4.7, "seconds": 1.9},
                       {"id": "9", "class_type": "SaveImage", "started": at - 2.8, "seconds": 0.8}],
             "cached": ["5", "6", "7"], "total_nodes": 7}
    c.queue.leases.complete(claim, outputs, now=at, trace=trace)
    return job.id


def dead(c: Console, n: int, at: float) -> str:
    job = make_job(n, meta={"team": "red", "customer": "c3"})
    c.queue.intake.submit([job], now=at - 50)
    claim = c.queue.leases.claim("gpu-b/1/gpu1/t", "gpu1", 60.0, now=at - 20)
    error = {"node_id": "3", "class_type": "KSampler", "exception_type": "torch.OutOfMemoryError",
             "message": "CUDA out of memory. Tried to allocate 2.50 GiB",
             "traceback": ["Traceback (most recent call last):\n", '  File "execution.py", line 496, in execute\n',
                           '  File "nodes.py", line 1525, in sample\n',
                           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB\n"]}
    c.queue.leases.dead(claim, "KSampler (node 3) raised torch.OutOfMemoryError: CUDA out of memory", now=at,
                        kind="oom", trace={"phases": [["claimed", at - 20], ["executing", at - 18], ["recorded", at]],
                                           "nodes": [], "cached": [], "error": error})
    return job.id


def slots(c: Console, running: list[str]) -> None:
    def slot(name: str, job: str | None, version: str) -> dict:
        return {"name": name, "device": f"cuda:{name[-1]}", "state": "running", "ready": True, "restarts": 1,
                "runner_restarts": 0, "comfyui_version": version, "warmup_seconds": 14.2, "job": job, "jobs": 212}

    c.queue.fleet.register_machine("gpu-a", 101, [slot("gpu0", running[0], "0.3.64"), slot("gpu1", None, "0.3.64")])
    c.queue.fleet.register_machine("gpu-b", 202, [slot("gpu0", running[1], "0.3.62")])


def fill(c: Console, video: bytes) -> tuple[str, str]:
    now = time.time()
    random.seed(4)
    first = ""
    for n in range(60):
        at = now - 3500 + n * 58 + random.random() * 20
        files = [(f"ComfyUI_{n:05d}_.png", png(160, 120, n))]
        if n == 59:
            files.append(("clip_00001_.webm", video))
        first = done(c, n, files, at, "portrait")
    dead_id = ""
    for n in range(5):
        dead_id = dead(c, 100 + n, now - 900 * n - 60)
    c.queue.intake.submit([make_job(200 + n, meta={"team": "blue"}) for n in range(12)])
    running = []
    for step in (12, 5):
        claim = c.queue.leases.claim(f"gpu-a/1/gpu{step % 2}/t", "gpu0", 600.0)
        c.queue.leases.set_progress(claim, {"node": 2, "nodes": 4, "node_id": "3", "class_type": "KSampler",
                                            "step": step, "steps": 20})
        c.queue.previews.set_preview(claim, "3", "image/png", png(96, 96, step))
        running.append(claim.id)
    slots(c, running)
    return first, dead_id


def main() -> int:
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1000", "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_script_timeout(20)
    with tempfile.TemporaryDirectory() as folder:
        config = api_config(Path(folder), token=TOKEN)
        with running_api(config) as url:
            runner = StandInRunner(config)
            c = Console(driver, url, runner)
            driver.get("about:blank")
            video = base64.b64decode(driver.execute_async_script(RECORD_WEBM))
            job_id, dead_id = fill(c, video)
            c.open("")
            c.css("#login-token")
            driver.save_screenshot(str(DOCS / "console-login.png"))
            c.css("#login-token").send_keys(TOKEN)
            c.css("#login-name").send_keys("ann")
            c.css("#login button[type=submit]").click()
            until(lambda: "Signed in" in c.text_of("#who"))
            c.css("section.slot img")
            time.sleep(1)  # the preview images load
            driver.save_screenshot(str(DOCS / "console-overview.png"))
            c.open("jobs?q=team%3Dred&state=dead")
            c.css("table.jobs")
            c.click("#bulk-retry")
            c.css("#bulk-confirm")
            driver.save_screenshot(str(DOCS / "console-search.png"))
            c.open(f"jobs/{job_id}")
            c.css(".gallery video")
            time.sleep(1)
            driver.set_window_size(1280, 1900)
            driver.save_screenshot(str(DOCS / "console-job.png"))
            c.open(f"jobs/{dead_id}")
            c.css(".traceback")
            driver.save_screenshot(str(DOCS / "console-dead-job.png"))
            driver.set_window_size(420, 1400)
            c.open("")
            c.css("section.slot")
            time.sleep(1)
            driver.save_screenshot(str(DOCS / "console-narrow.png"))
            runner.close()
    driver.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
