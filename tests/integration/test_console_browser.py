"""The operator's console in a real headless Chromium (Debian's chromium and chromium-driver, driven by Selenium):
one browser and one API (with a token, over SQLite) shared by the module, so each check costs a page or two.

Skipped, saying why, where chromium, chromedriver or selenium is absent.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from comfysup.queue.base import Output
from tests.api_support import StandInRunner, api_config, running_api
from tests.queue_contract import make_job

TOKEN = "console-test-token"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WHY_NOT = None if CHROMIUM and CHROMEDRIVER else "chromium or chromedriver is not installed (apt-get install " \
    "chromium chromium-driver)"
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")

RECORD_WEBM = """
const done = arguments[arguments.length - 1];
const canvas = document.createElement('canvas'); canvas.width = 64; canvas.height = 48;
const g = canvas.getContext('2d'); let n = 0;
const timer = setInterval(() => { g.fillStyle = n++ % 2 ? '#c33' : '#36c'; g.fillRect(0, 0, 64, 48); }, 30);
const rec = new MediaRecorder(canvas.captureStream(30), {mimeType: 'video/webm;codecs=vp8'});
const parts = []; rec.ondataavailable = (e) => parts.push(e.data);
rec.onstop = async () => { clearInterval(timer);
  const buf = new Uint8Array(await new Blob(parts).arrayBuffer()); let s = '';
  for (const b of buf) s += String.fromCharCode(b); done(btoa(s)); };
rec.start(); setTimeout(() => rec.stop(), 600);
"""
"""A short real WebM (VP8) the browser itself encodes: a video output its player can play."""


def until(what: Callable[[], Any], seconds: float = 10.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        got = what()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(step)


class Console:
    """The shared pieces: the browser, the API's URL, a queue of its own, and a stand-in runner."""

    def __init__(self, driver: Any, url: str, runner: StandInRunner) -> None:
        self.driver, self.url, self.runner = driver, url, runner
        self.queue = runner.queue

    def open(self, path: str) -> None:
        self.driver.get(f"{self.url}/console/{path}")

    def css(self, selector: str) -> Any:
        from selenium.webdriver.common.by import By

        return until(lambda: self.driver.find_elements(By.CSS_SELECTOR, selector))[0]

    def click(self, selector: str) -> None:
        """Click the element once it is there, found and clicked in one step of the page (a live overview
        re-renders its cards every few seconds: an element found first and clicked later may be gone)."""
        script = "const e = document.querySelector(arguments[0]); if (e) { e.click(); return true; } return false;"
        until(lambda: self.driver.execute_script(script, selector))

    def text_of(self, selector: str) -> str:
        """The element's text once it is there (read in the page: a live re-render never leaves it stale)."""
        script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;"
        return str(until(lambda: self.driver.execute_script(script, selector) is not None and
                         self.driver.execute_script(script, selector)))


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900", "--autoplay-policy=no-user-gesture-required"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(20)
    tmp = tmp_path_factory.mktemp("console")
    config = api_config(tmp, token=TOKEN)
    try:
        with running_api(config) as url:
            runner = StandInRunner(config)
            try:
                yield Console(driver, url, runner)
            finally:
                runner.close()
    finally:
        driver.quit()


def _login(c: Console) -> None:
    c.open("")
    c.css("#login-token").send_keys(TOKEN)
    c.css("#login-name").send_keys("ann")
    c.css("#login button[type=submit]").click()
    until(lambda: "Signed in as ann" in c.text_of("#who"))


def _done_with_video(c: Console, n: int, video: bytes) -> str:
    """A job done with a WebM output and a traced attempt (claimed, posted, executing, downloading)."""
    job = make_job(n, meta={"team": "video"})
    c.queue.intake.submit([job])
    claim = c.queue.leases.claim("host/1/gpu0/t", "gpu0", 60.0)
    assert claim is not None and claim.id == job.id
    folder = c.runner.store / claim.id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "clip.webm").write_bytes(video)
    t = time.time()
    trace = {"phases": [["claimed", t - 3], ["posted", t - 2.9], ["executing", t - 2.5], ["downloading", t - 0.4],
                        ["recorded", t]],
             "nodes": [{"id": "1", "class_type": "EmptyImage", "started": t - 2.5, "seconds": 0.5},
                       {"id": "2", "class_type": "SaveWEBM", "started": t - 2.0, "seconds": 1.6}], "cached": []}
    output = Output("clip.webm", len(video), hashlib.sha256(video).hexdigest(), str(folder / "clip.webm"))
    c.queue.leases.complete(claim, [output], trace=trace)
    return job.id


def _dead(c: Console, n: int, team: str) -> str:
    job = make_job(n, meta={"team": team})
    c.queue.intake.submit([job])
    claim = c.queue.leases.claim("host/1/gpu0/t", "gpu0", 60.0)
    assert claim is not None and claim.id == job.id
    c.queue.leases.dead(claim, "KSampler raised: CUDA out of memory", kind="oom")
    return job.id


@pytest.mark.timeout(60)
def test_search_a_job_page_with_its_timeline_and_video_and_a_bulk_retry_with_authority(console: Console) -> None:
    c = console
    c.open("")
    assert "Sign in" in c.text_of("main h1")  # a token is set: nothing of the queue without a login
    _login(c)
    c.driver.get("about:blank")
    video = base64.b64decode(c.driver.execute_async_script(RECORD_WEBM))
    assert video[:4] == b"\x1a\x45\xdf\xa3", "the browser did not record a WebM"
    job_id = _done_with_video(c, 1, video)
    dead = [_dead(c, 10 + n, "red") for n in range(3)] + [_dead(c, 20, "blue")]

    # a search finds the job, from the search box, and its URL can be shared
    c.open("jobs")
    box = c.css("#q")
    box.send_keys("team=video")
    box.submit()
    until(lambda: "q=team%3Dvideo" in c.driver.current_url)
    link = c.css(f"tr[data-id='{job_id}'] a")
    assert link.get_attribute("href").endswith(f"/console/jobs/{job_id}")
    link.click()

    # the job's page: its attempt as a timeline, and its video output plays
    until(lambda: "Attempt 1: done" in c.text_of("section.attempt h3"))
    phases = [e.get_attribute("class") for e in c.driver.find_elements("css selector", ".timeline span")]
    assert phases == ["ph-claimed", "ph-posted", "ph-executing", "ph-downloading"]
    c.css(".gallery video")
    played = c.driver.execute_async_script(
        "const done = arguments[0]; const v = document.querySelector('.gallery video');"
        "v.play().then(() => setTimeout(() => done({t: v.currentTime, e: v.error && v.error.code}), 300),"
        " (err) => done({t: -1, e: String(err)}));")
    assert played["e"] is None and played["t"] > 0, played

    # retry every dead letter of a search: counted, confirmed, done
    c.open("jobs?q=team%3Dred&state=dead")
    c.css("#bulk-retry").click()
    assert c.text_of("#bulk-confirm") == "Retry 3 dead job(s)"
    c.css("#bulk-confirm").click()
    until(lambda: "Retried 3 dead job(s)" in c.text_of("#bulk"))
    states = c.queue.reads.states(dead)
    assert [states[i] for i in dead] == ["queued", "queued", "queued", "dead"]

    # refused without a login, without the CSRF token, and from a foreign origin
    url = f"{c.url}/console/api/actions/retry-search"
    body = {"q": "team=blue", "expected": 1}
    assert requests.post(url, json=body, headers={"Origin": c.url}, timeout=10).status_code == 401
    cookie = {"comfysup_console": c.driver.get_cookie("comfysup_console")["value"]}
    assert requests.post(url, json=body, headers={"Origin": c.url}, cookies=cookie, timeout=10).status_code == 403
    csrf = c.driver.execute_script("return fetch('api/session').then(r => r.json()).then(s => s.csrf)")
    foreign = requests.post(url, json=body, cookies=cookie, timeout=10,
                            headers={"Origin": "http://evil.example", "X-CSRF-Token": csrf})
    assert foreign.status_code == 403
    assert c.queue.reads.states([dead[3]])[dead[3]] == "dead"
    allowed = requests.post(url, json=body, cookies=cookie, timeout=10, headers={"Origin": c.url, "X-CSRF-Token": csrf})
    assert allowed.status_code == 200 and allowed.json()["retried"] == 1


@pytest.mark.timeout(60)
def test_the_overview_updates_live_while_jobs_run(console: Console) -> None:
    c = console
    c.open("")
    shown = "return document.querySelector('#login-token') ? 'login' : document.querySelector('#counts') && 'counts'"
    if until(lambda: c.driver.execute_script(shown)) == "login":
        _login(c)
    done_before = int(c.text_of("a.count[data-state=done] b"))
    c.driver.execute_script("window.notReloaded = true")
    c.queue.intake.submit([make_job(100 + n) for n in range(3)])
    stop = threading.Event()
    worker = threading.Thread(target=lambda: [c.runner.run_one() for _ in range(3)] and stop.set(), daemon=True)
    worker.start()
    until(lambda: int(c.text_of("a.count[data-state=done] b")) >= done_before + 3, seconds=15)
    assert c.driver.execute_script("return window.notReloaded === true"), "the page reloaded instead of updating"
    # by keyboard: the first Tab reaches the skip link, and a focused control keeps its focus through a live update
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    c.driver.execute_script("document.activeElement.blur(); window.focus();")
    ActionChains(c.driver).send_keys(Keys.TAB).perform()
    assert c.driver.execute_script("return document.activeElement.className") == "skip"
    stamp = "return document.querySelector('.updated time').getAttribute('datetime')"
    before = c.driver.execute_script("document.getElementById('count-done').focus();" + stamp)
    until(lambda: c.driver.execute_script(stamp) != before, seconds=10)  # the page was rendered again
    assert c.driver.execute_script("return document.activeElement.id") == "count-done"
    worker.join(10)


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_slot_drained_from_the_console_takes_no_new_job(console: Console, tmp_path: Path) -> None:
    """A real ``comfysup run`` with two fake ComfyUI servers: Drain on cpu0's card, and every job runs on cpu1
    until it is put back."""
    from tests.port_support import server_port
    from tests.supervisor_support import Supervised, job

    port = server_port()
    sup = Supervised(tmp_path, extra_sections={"api": {"listen": f"127.0.0.1:{port}", "token": TOKEN}})
    proc = sup.start()
    try:
        sup.wait_ready(proc)
        url = f"http://127.0.0.1:{port}"
        sup.wait_api(url)
        c = Console(console.driver, url, console.runner)
        _login(c)
        c.click("section.slot[data-slot=cpu0] button.drain")
        until(lambda: sup.slot("cpu0").get("held_by"), seconds=15)
        ids = sup.submit([job(n) for n in range(6)])
        ran = sup.wait_terminal(ids)
        assert {j.state for j in ran.values()} == {"done"}
        assert {a.server for j in ran.values() for a in j.attempts} == {"cpu1"}
        c.click("section.slot[data-slot=cpu0] button.put-back")
        until(lambda: sup.slot("cpu0").get("held_by") is None and sup.slot("cpu0").get("ready"), seconds=15)
    finally:
        sup.stop(proc)
        sup.cleanup()


def _prefix_proxy(target: str, prefix: str) -> tuple[str, Callable[[], None]]:
    """A reverse proxy on its own loopback port that serves ``target`` under ``prefix`` (keeping Host, sending
    X-Forwarded-Prefix), streaming each answer as it comes; its URL and a function that stops it."""
    import asyncio

    from aiohttp import ClientSession, web

    async def forward(request: web.Request) -> web.StreamResponse:
        path = request.path_qs.removeprefix(prefix)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("content-length",
                                                                                "transfer-encoding")}
        headers["X-Forwarded-Prefix"] = prefix
        async with ClientSession(auto_decompress=False) as session, session.request(
                request.method, target + path, headers=headers, data=await request.read(),
                allow_redirects=False) as answer:
            response = web.StreamResponse(status=answer.status, headers={
                k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "transfer-encoding")})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            return response

    box: dict[str, Any] = {}
    ready = threading.Event()

    def main() -> None:
        async def go() -> None:
            app = web.Application()
            app.router.add_route("*", prefix + "/{tail:.*}", forward)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            box["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
            ready.set()
            await box["stop"].wait()
            await runner.cleanup()
        asyncio.run(go())

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    assert ready.wait(10)
    return f"http://127.0.0.1:{box['port']}{prefix}", lambda: (box["loop"].call_soon_threadsafe(box["stop"].set),
                                                                 thread.join(10))


@pytest.mark.timeout(60)
def test_behind_a_reverse_proxy_under_a_path_prefix(console: Console) -> None:
    c = console
    url, stop = _prefix_proxy(c.url, "/ops")
    try:
        proxied = Console(c.driver, url, c.runner)
        job = make_job(300, meta={"team": "proxied"})
        c.queue.intake.submit([job])
        proxied.open("jobs?q=team%3Dproxied")
        shown = "return document.querySelector('#login-token') ? 'login' : document.querySelector('table') && 'jobs'"
        if until(lambda: c.driver.execute_script(shown)) == "login":
            proxied.css("#login-token").send_keys(TOKEN)
            proxied.click("#login button[type=submit]")
        proxied.click(f"tr[data-id='{job.id}'] a")
        until(lambda: c.driver.current_url == f"{url}/console/jobs/{job.id}")
        assert c.driver.get_cookie("comfysup_console")["path"] in ("/ops/console/", "/console/")
        until(lambda: job.id in proxied.text_of("main h1"))
        proxied.click("#cancel")
        until(lambda: c.queue.reads.states([job.id])[job.id] == "cancelled")
    finally:
        stop()
