"""fake_comfy's hostile mode: every mutation of the catalogue really mangles the answer it names.

Each test fetches the affected answer with a plain client (requests, websocket-client), reads it with
bounded reads (a time and a size limit, so a trickled or endless body cannot hold a test), and checks
that it is malformed in the promised way. The checks are written here, from the mutation's name, not
taken from fake_comfy, so a mutation that stops mangling fails its test.
"""

from __future__ import annotations

import json
import math
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import websocket

from fake_comfy import FakeComfy
from fake_comfy.cli import parse_options
from fake_comfy.hostile import CATALOGUE, DEPTH, WHERE, choose
from fake_comfy.script import ScriptError
from fake_comfy.server import trivial_prompt

TIMEOUT = 10.0
TRICKLE_S = 0.2
CONTROL_CHARS = ("\r", "\n", "\x1b", "\x00")
TYPES = {"str": str, "list": list, "object": dict, "number": (int, float), "null": type(None)}


@dataclass
class Answer:
    """An HTTP answer read with a bound: `broken` when the connection ended before the declared body."""

    status: int
    headers: dict[str, str]
    body: bytes
    broken: bool
    ended: bool

    @property
    def declared(self) -> int | None:
        length = self.headers.get("Content-Length")
        return int(length) if length is not None else None

    def json(self) -> Any:
        return json.loads(self.body)


def fetch(url: str, method: str = "GET", body: Any = None, seconds: float = 5.0, max_bytes: int = 48 << 20,
          step: int = 1 << 16) -> Answer:
    """Read at most `max_bytes` for at most about `seconds` (`step` bytes per read)."""
    chunks: list[bytes] = []
    size, broken, ended = 0, False, False
    with requests.request(method, url, json=body, stream=True, timeout=(TIMEOUT, TIMEOUT)) as response:
        deadline = time.monotonic() + seconds
        try:
            while time.monotonic() < deadline and size < max_bytes:
                chunk = response.raw.read(step, decode_content=False)
                if not chunk:
                    ended = True
                    break
                chunks.append(chunk)
                size += len(chunk)
        except Exception as exc:  # urllib3's ProtocolError (IncompleteRead), a reset: the body was cut
            broken = "IncompleteRead" in repr(exc) or "Connection" in repr(exc) or isinstance(exc, OSError)
        return Answer(response.status_code, dict(response.headers), b"".join(chunks), broken, ended)


def values_at(value: Any, path: str, prompt_id: str = "") -> list[Any]:
    """What a dotted path names ('*' every key or item, '@' the prompt id, '' the value itself)."""
    level = [value]
    for part in path.split(".") if path else []:
        part = prompt_id if part == "@" else part
        following = []
        for holder in level:
            if isinstance(holder, dict):
                following += list(holder.values()) if part == "*" else [holder[part]] if part in holder else []
            elif isinstance(holder, list):
                following += holder if part == "*" else (
                    [holder[int(part)]] if part.isdigit() and int(part) < len(holder) else [])
        level = following
    return level


def longest_run(body: bytes, byte: bytes) -> int:
    """The longest run of one byte (the nesting depth of `[[[...`), without parsing."""
    best = run = 0
    start = body.find(byte)
    while start != -1:
        end = start
        while end < len(body) and body[end : end + 1] == byte:
            end += 1
        run = end - start
        best = max(best, run)
        start = body.find(byte, end)
    return best


@dataclass
class Run:
    prompt_id: str
    post: Answer
    frames: list[str | bytes] = field(default_factory=list)


def status_remaining(frame: str | bytes) -> int | None:
    if not isinstance(frame, str):
        return None
    try:
        message = json.loads(frame)
        return message["data"]["status"]["exec_info"]["queue_remaining"] if message["type"] == "status" else None
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def run(fake: FakeComfy, word: str, wait: bool = True, **read: Any) -> Run:
    """Post the trivial prompt with `word` and collect every frame its client hears until it ends.

    The end: the status broadcast (never mangled: it names no prompt) that says the queue is back to
    what it was when the client connected, then the frame that follows it (the final executing message,
    perhaps mangled).
    """
    prompt_id, client_id = uuid.uuid4().hex, uuid.uuid4().hex
    fake.script_by_id({prompt_id: [word]})
    # websocket-client checks UTF-8 in pure Python: 8 MiB frames took seconds each (the huge ones are valid text)
    ws = websocket.create_connection(f"{fake.ws_url}?clientId={client_id}", timeout=TIMEOUT,
                                     skip_utf8_validation=":huge-" in word)
    try:
        idle = status_remaining(ws.recv())
        body = {"prompt": trivial_prompt(uuid.uuid4().int % 0xFFFFFF, "hostile"), "prompt_id": prompt_id,
                "client_id": client_id}
        post = fetch(fake.url + "/prompt", "POST", body, **read)
        result = Run(prompt_id, post)
        queued = False
        while wait:
            frame = ws.recv()
            result.frames.append(frame)
            remaining = status_remaining(frame)
            queued = queued or (remaining is not None and remaining > (idle or 0))
            if queued and remaining == idle:
                result.frames.append(ws.recv())
                break
    finally:
        ws.close(timeout=2)
    return result


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeComfy]:
    base = tmp_path_factory.mktemp("hostile")
    with FakeComfy(base_directory=base, node_ms=1, hostile_trickle_s=TRICKLE_S, hostile_cap_s=5) as server:
        yield server


@pytest.fixture(scope="module")
def busy_fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeComfy]:
    """One prompt hangs at the front, so a posted prompt stays pending (GET /queue always shows it)."""
    base = tmp_path_factory.mktemp("hostile-busy")
    with FakeComfy(base_directory=base, node_ms=1, busy=1, hostile_trickle_s=TRICKLE_S, hostile_cap_s=5) as server:
        yield server


def names(where: str, *, without: tuple[str, ...] = ()) -> list[str]:
    return [n for n, m in CATALOGUE.items() if m.where == where and not any(w in n for w in without)]


# -- the answer's defects, one check per kind of mutation --------------------------------------------------


def check_json_answer(answer: Answer, what: str, prompt_id: str, where: str) -> None:
    """What a mutation named `where:what` promises about one HTTP answer."""
    from fake_comfy.hostile_bodies import CONTROL_AT, HUGE_LIST_AT, HUGE_STRING_AT, NUMBERS_AT

    assert answer.status == 200
    if "=" in what and not what.startswith("numbers="):
        path, kind = what.split("=")
        found = values_at(answer.json(), "" if path == "$" else path, prompt_id)
        assert found and all(isinstance(v, TYPES[kind]) and not isinstance(v, bool) for v in found), found
    elif what == "truncated":
        assert answer.ended and answer.declared == len(answer.body)
        with pytest.raises(ValueError):
            answer.json()
    elif what == "cut":
        assert answer.broken and answer.declared is not None and len(answer.body) < answer.declared
    elif what == "not-json":
        assert answer.headers["Content-Type"].startswith("application/json") and answer.body.startswith(b"<html>")
    elif what == "content-type":
        assert answer.headers["Content-Type"].startswith("text/html")
        answer.json()
    elif what == "deep":
        assert longest_run(answer.body, b"[") == DEPTH and longest_run(answer.body, b"]") == DEPTH
    elif what == "trickle":  # read for 1 s at one byte per 0.2 s: a handful of bytes of a longer body
        assert answer.declared is not None and 0 < len(answer.body) <= 1.0 / TRICKLE_S + 2 < answer.declared
    elif what == "endless":
        assert "Content-Length" not in answer.headers and not answer.ended and len(answer.body) >= 4 << 20
    elif what == "huge-string":
        found = values_at(answer.json(), HUGE_STRING_AT[where], prompt_id)
        assert found and all(isinstance(v, str) and len(v) >= 8 << 20 for v in found)
    elif what == "huge-list":
        found = values_at(answer.json(), HUGE_LIST_AT[where], prompt_id)
        assert found and all(isinstance(v, list) and len(v) >= 1_000_000 for v in found)
    elif what == "control":
        found = [v for p in CONTROL_AT[where] for v in values_at(answer.json(), p, prompt_id)]
        assert found and all(all(c in v for c in CONTROL_CHARS) for v in found)
    elif what.startswith("numbers="):
        found = [v for p in NUMBERS_AT[where] for v in values_at(answer.json(), p, prompt_id)]
        assert found and all(number_is(what.split("=")[1], v) for v in found), found
    else:
        pytest.fail(f"no check for {where}:{what}")


def number_is(kind: str, value: Any) -> bool:
    return {
        "infinity": lambda v: v == math.inf,
        "nan": lambda v: isinstance(v, float) and math.isnan(v),
        "1e999": lambda v: v == math.inf,  # json reads 1e999 as a float overflow
        "negative": lambda v: isinstance(v, int) and v < -(2**63),
        "huge": lambda v: isinstance(v, int) and v > 10**399,
    }[kind](value)


def reader_for(what: str) -> dict[str, Any]:
    if what == "trickle":
        return {"seconds": 1.0, "step": 1}
    if what == "endless":
        return {"seconds": 3.0, "max_bytes": 4 << 20}
    return {}


# -- the tests -----------------------------------------------------------------------------------------


def test_every_place_a_client_reads_has_mutations() -> None:
    assert {m.where for m in CATALOGUE.values()} == set(WHERE)
    assert all(m.doc and callable(m.fn) and name.startswith(m.where + ":") for name, m in CATALOGUE.items())


@pytest.mark.parametrize("name", names("post"))
def test_post_mutations(fake: FakeComfy, name: str) -> None:
    what = name.split(":", 1)[1]
    result = run(fake, "hostile:" + name, wait=what not in ("trickle", "endless"), **reader_for(what))
    answer = result.post
    check_json_answer(answer, what, result.prompt_id, "post")
    hostile = fake.stats()["prompts"][result.prompt_id]["hostile"]
    assert (hostile["mutation"], hostile["where"], hostile["source"]) == (name, "post", "script")
    assert hostile["hits"] == 1


@pytest.mark.parametrize("name", names("history"))
@pytest.mark.parametrize("route", ["/history/{id}", "/history"])
def test_history_mutations(fake: FakeComfy, name: str, route: str) -> None:
    what = name.split(":", 1)[1]
    if route == "/history" and what in ("trickle", "endless", "cut"):
        pytest.skip("body-level mutations are the same for both routes; checked on /history/{id}")
    result = run(fake, "hostile:" + name)
    answer = fetch(fake.url + route.format(id=result.prompt_id), **reader_for(what))
    check_json_answer(answer, what, result.prompt_id, "history")
    assert fake.stats()["prompts"][result.prompt_id]["hostile"]["hits"] >= 1
    requests.post(fake.url + "/history", json={"delete": [result.prompt_id]}, timeout=TIMEOUT)


@pytest.mark.parametrize("name", names("system_stats") + names("object_info"))
def test_server_wide_mutations_fire_once(fake: FakeComfy, name: str) -> None:
    where, what = name.split(":", 1)
    result = run(fake, "hostile:" + name)
    route = "/" + where
    check_json_answer(fetch(fake.url + route, **reader_for(what)), what, result.prompt_id, where)
    assert fetch(fake.url + route).json() == requests.get(fake.url + route, timeout=TIMEOUT).json()
    assert fake.stats()["prompts"][result.prompt_id]["hostile"]["hits"] == 1


@pytest.mark.parametrize("name", names("queue"))
def test_queue_mutations(busy_fake: FakeComfy, name: str) -> None:
    what = name.split(":", 1)[1]
    result = run(busy_fake, "hostile:" + name, wait=False)
    try:
        check_json_answer(fetch(busy_fake.url + "/queue", **reader_for(what)), what, result.prompt_id, "queue")
        assert requests.get(busy_fake.url + "/queue", timeout=TIMEOUT).json()["queue_pending"][0][1] == result.prompt_id
    finally:
        requests.post(busy_fake.url + "/queue", json={"delete": [result.prompt_id]}, timeout=TIMEOUT)


def parsed(frames: list[str | bytes]) -> list[Any]:
    out = []
    for frame in frames:
        if isinstance(frame, str):
            try:
                out.append(json.loads(frame))
            except (ValueError, RecursionError):
                pass
    return out


def check_ws(what: str, frames: list[str | bytes]) -> None:
    texts = [f for f in frames if isinstance(f, str)]
    binary = [f for f in frames if isinstance(f, bytes)]
    messages = parsed(frames)
    if "=" in what and not what.startswith("numbers="):
        path, kind = what.split("=")
        found = [v for m in messages for v in values_at(m, "" if path == "$" else path)]
        assert any(isinstance(v, TYPES[kind]) and not isinstance(v, bool) for v in found), found
    elif what == "binary-noise":
        assert len(binary) == 1 and len(binary[0]) == 64
    elif what == "unknown-type":
        assert "fake_comfy_unknown" in [m.get("type") for m in messages if isinstance(m, dict)]
    elif what in ("not-json", "truncated"):
        assert sum(1 for t in texts if t.startswith(("<html>", '{"type": "executing"')) and t not in
                   [json.dumps(m) for m in messages]) >= 3
    elif what == "deep":
        assert max(longest_run(t.encode(), b"[") for t in texts) == DEPTH
    elif what == "huge-string":
        assert any(len(m["data"]["node"] or "") >= 8 << 20 for m in messages if m.get("type") == "executing")
    elif what == "huge-list":
        assert any(len(m["data"]["nodes"]) >= 1_000_000 for m in messages if m.get("type") == "progress_state")
    elif what == "control":
        assert any(all(c in (m["data"]["node"] or "") for c in CONTROL_CHARS)
                   for m in messages if m.get("type") == "executing")
    elif what.startswith("numbers="):
        states = [m["data"]["nodes"] for m in messages if m.get("type") == "progress_state"]
        values = [node["value"] for nodes in states for node in nodes.values()]
        assert values and all(number_is(what.split("=")[1], v) for v in values)
    elif what.startswith("preview-"):
        assert len(binary) == 1
        frame = binary[0]
        if what == "preview-short":
            assert len(frame) < 4
        elif what == "preview-unknown-event":
            assert struct.unpack(">I", frame[:4])[0] not in (1, 2, 3, 4)
        elif what == "preview-bad-length":
            assert struct.unpack(">II", frame[:8]) == (4, 0xFFFFFFFF) and len(frame) < 0xFFFFFFFF
        elif what == "preview-metadata-not-json":
            length = struct.unpack(">I", frame[4:8])[0]
            with pytest.raises(ValueError):
                json.loads(frame[8 : 8 + length])
        elif what == "preview-not-an-image":
            assert struct.unpack(">II", frame[:8]) == (1, 1) and not frame[8:].startswith(b"\xff\xd8")
        elif what == "preview-huge":
            assert len(frame) >= 8 << 20
        else:
            pytest.fail(f"no check for ws:{what}")
    else:
        pytest.fail(f"no check for ws:{what}")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if "huge" in n else n for n in names("ws")]
)
def test_ws_mutations(fake: FakeComfy, name: str) -> None:
    result = run(fake, "hostile:" + name)
    check_ws(name.split(":", 1)[1], result.frames)
    assert fake.stats()["prompts"][result.prompt_id]["hostile"]["hits"] >= 1


@pytest.mark.parametrize("name", names("names"))
def test_names_mutations_in_history_and_executed(fake: FakeComfy, name: str) -> None:
    result = run(fake, "hostile:" + name)
    entry = fetch(f"{fake.url}/history/{result.prompt_id}").json()[result.prompt_id]
    executed = [m["data"] for m in parsed(result.frames) if m.get("type") == "executed"]
    for images in (entry["outputs"]["3"]["images"], executed[0]["output"]["images"]):
        image = images[0]
        if name == "names:traversal":
            assert image["filename"].startswith("../") and ".." in image["subfolder"]
        elif name == "names:absolute":
            assert image["filename"].startswith("/") and image["subfolder"].startswith("/")
        elif name == "names:crlf":
            assert "\r\n" in image["filename"]
        elif name == "names:type-path":
            assert image["type"] == "../../etc"
        else:
            assert all(c in image["filename"] + image["subfolder"] for c in ("\x1b", "\x00", "\x07"))
        assert fetch(f"{fake.url}/view?" + requests.compat.urlencode(image)).status in (400, 403, 404)


@pytest.mark.parametrize("name", names("view"))
def test_view_mutations(fake: FakeComfy, name: str) -> None:
    what = name.split(":", 1)[1]
    result = run(fake, "hostile:" + name)
    image = fetch(f"{fake.url}/history/{result.prompt_id}").json()[result.prompt_id]["outputs"]["3"]["images"][0]
    path = fake.output_directory / image["subfolder"] / image["filename"]
    real = Path(path).read_bytes()
    answer = fetch(f"{fake.url}/view?" + requests.compat.urlencode(image), **reader_for(what))
    assert answer.status == 200
    if what == "truncated":
        assert answer.ended and answer.body == real[: len(real) // 2] and answer.declared == len(answer.body)
    elif what == "cut":
        assert answer.broken and answer.declared == len(real) and len(answer.body) < len(real)
    elif what == "content-type":
        assert answer.headers["Content-Type"].startswith("text/html") and answer.body == real
    elif what == "not-an-image":
        assert answer.headers["Content-Type"] == "image/png" and answer.body.startswith(b"<html>")
    elif what == "trickle":
        assert 0 < len(answer.body) <= 1.0 / TRICKLE_S + 2 < answer.declared == len(real)
    elif what == "endless":
        assert "Content-Length" not in answer.headers and not answer.ended and len(answer.body) >= 4 << 20
        assert answer.body.startswith(real[:8])
    else:
        pytest.fail(f"no check for {name}")
    assert fake.stats()["prompts"][result.prompt_id]["hostile"]["hits"] == 1


@pytest.mark.slow
def test_endless_and_trickled_bodies_stop_at_the_cap(tmp_path: Path) -> None:
    """Bounded by the fake itself: past hostile_cap_s the connection is dropped, whoever is reading."""
    with FakeComfy(base_directory=tmp_path, node_ms=1, hostile_trickle_s=0.05, hostile_cap_s=1.0) as fake:
        result = run(fake, "hostile:history:endless")
        started = time.monotonic()
        answer = fetch(f"{fake.url}/history/{result.prompt_id}", seconds=15.0, max_bytes=1 << 40)
        assert answer.broken and not answer.ended and time.monotonic() - started < 10.0
        result = run(fake, "hostile:post:endless", wait=False, seconds=15.0, max_bytes=1 << 40)
        assert result.post.broken
        result = run(fake, "hostile:history:trickle")
        started = time.monotonic()
        answer = fetch(f"{fake.url}/history/{result.prompt_id}", seconds=15.0, step=1)
        assert answer.broken and answer.declared is not None and len(answer.body) < answer.declared
        assert time.monotonic() - started < 10.0


def test_a_stuck_prompt_survives_interrupt_until_the_server_stops(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path, node_ms=1) as fake:
        prompt_id = uuid.uuid4().hex
        fake.script_by_id({prompt_id: ["hostile:run:ignore-interrupt"]})
        ws = websocket.create_connection(f"{fake.ws_url}?clientId=stuck", timeout=TIMEOUT)
        try:
            body = {"prompt": trivial_prompt(1, "stuck"), "prompt_id": prompt_id, "client_id": "stuck"}
            requests.post(fake.url + "/prompt", json=body, timeout=TIMEOUT).raise_for_status()
            while True:  # executing its second node, where it gets stuck
                message = json.loads(ws.recv())
                if message["type"] == "executing" and message["data"]["node"] == "2":
                    break
            for body in ({}, {"prompt_id": prompt_id}):
                assert requests.post(fake.url + "/interrupt", json=body, timeout=TIMEOUT).status_code == 200
            follower = run(fake, "ok", wait=False)
            # the follower's post answered after both interrupts: the worker is still stuck
            queue = requests.get(fake.url + "/queue", timeout=TIMEOUT).json()
            assert [item[1] for item in queue["queue_running"]] == [prompt_id]
            assert [item[1] for item in queue["queue_pending"]] == [follower.prompt_id]
            assert [i["effective"] for i in fake.stats()["interrupts"]] == [True, True]
            assert [m for m in parsed([ws.recv()]) if m.get("type") == "execution_interrupted"] == []
            assert fake.stats()["prompts"][prompt_id]["executions"][0]["outcome"] is None
        finally:
            ws.close(timeout=2)
    assert fake.stats()["prompts"][prompt_id]["executions"][0]["outcome"] == "stopped"


def test_the_seed_picks_the_same_mutations_for_the_same_ids() -> None:
    ids = [f"job-{i}" for i in range(200)]
    first = [choose(7, 0.3, i) for i in ids]
    assert first == [choose(7, 0.3, i) for i in ids]
    assert first != [choose(8, 0.3, i) for i in ids]
    assert 30 < sum(n is not None for n in first) < 90
    assert all(choose(7, 0.0, i) is None for i in ids)
    only = {choose(7, 1.0, i, ["history", "ws:not-json"]) for i in ids}
    assert only <= {n for n in CATALOGUE if n.startswith("history:")} | {"ws:not-json"} and len(only) > 5


def test_seed_mode_in_process_records_what_hit_each_prompt(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path, node_ms=1, hostile_seed=3, hostile_rate=1.0,
                   hostile_only=["history:@.status=str"]) as fake:
        result = run(fake, "ok")
        assert isinstance(fetch(f"{fake.url}/history/{result.prompt_id}").json()[result.prompt_id]["status"], str)
        hostile = fake.stats()["prompts"][result.prompt_id]["hostile"]
        assert (hostile["mutation"], hostile["source"], hostile["hits"]) == ("history:@.status=str", "seed", 1)
        assert fake.stats()["prompts"][result.prompt_id]["posts"][0]["word"] == "hostile:history:@.status=str"
        fake.hostile_seed = None
        clean = run(fake, "ok")
        assert "hostile" not in fake.stats()["prompts"][clean.prompt_id]
        assert isinstance(fetch(f"{fake.url}/history/{clean.prompt_id}").json()[clean.prompt_id]["status"], dict)


def test_script_and_command_line_vocabulary() -> None:
    options = parse_options(["--hostile-seed", "5", "--hostile-rate", "0.5", "--hostile-only", "ws,view:cut",
                             "--script", "hostile:ws:not-json,ok,hostile"])
    assert (options.hostile_seed, options.hostile_rate, options.hostile_only) == (5, 0.5, ["ws", "view:cut"])
    assert options.script == ["hostile:ws:not-json", "ok", "hostile"]
    for bad in ("hostile:nope", "hostile:NAME", "hostile:"):
        with pytest.raises(ScriptError):
            parse_options(["--script", bad])


def test_hostile_list_prints_the_whole_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    from fake_comfy.cli import main

    assert main(["--hostile-list"]) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [(name, where) for name, where, _doc in rows] == [(m.name, m.where) for m in CATALOGUE.values()]


def test_fake_control_sets_hostile_words_and_the_seed(fake: FakeComfy) -> None:
    prompt_id = uuid.uuid4().hex
    control = fake.url + "/fake/control"
    answer = requests.post(control, json={"script_by_id": {prompt_id: ["hostile:nope"]}}, timeout=TIMEOUT)
    assert answer.status_code == 400
    assert requests.post(control, json={"hostile_seed": 11, "hostile_rate": 0.5}, timeout=TIMEOUT).ok
    try:
        assert (fake.hostile_seed, fake.hostile_rate) == (11, 0.5)
    finally:
        requests.post(control, json={"hostile_seed": None}, timeout=TIMEOUT)
    assert fake.hostile_seed is None


def test_store_temp_name_lists_a_written_copy_under_a_clients_temporary_name(fake: FakeComfy) -> None:
    result = run(fake, "hostile:run:store-temp-name")
    images = fetch(f"{fake.url}/history/{result.prompt_id}").json()[result.prompt_id]["outputs"]["3"]["images"]
    assert [i["filename"] for i in images] == [f".{images[1]['filename']}.part", images[1]["filename"]]
    for image in images:  # both written, both served
        assert fetch(f"{fake.url}/view?" + requests.compat.urlencode(image)).status == 200
