"""fake_comfy against the recordings of a real ComfyUI 0.3.64, and each script word against its promise.

The recorded-scenario tests drive a server exactly as the recording's client did and compare shapes
(status codes, JSON keys at every level, event types in order, who received them), never ids or
timings. They run against the fake, and against a real ComfyUI too when COMFYUI_DIR names a checkout
that runs with --cpu (COMFYUI_PYTHON: the Python of its environment). The recordings are the project's own copy
in tests/recorded (tests/recorded/refresh copies a newer recording in).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
import websocket
from port_support import server_port

from fake_comfy import FakeComfy
from fake_comfy.cli import parse_options
from fake_comfy.options import MAXIMUM_HISTORY_SIZE
from fake_comfy.script import ScriptError
from fake_comfy.server import BUSY_CLIENT_ID, trivial_prompt

ROOT = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).resolve().parents[1] / "recorded"  # tests/recorded: refresh it with tests/recorded/refresh
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
AIOHTTP_500 = "500 Internal Server Error\n\nServer got itself in trouble"
TIMEOUT = 10.0
OMIT: Any = object()

# -- shapes -------------------------------------------------------------------------------------------

WILDCARD = "*"
_ELIDED = re.compile(r"<[a-z_ ]+>")  # the recordings' elisions, e.g. "<prompt>"


def shape(value: Any, aliases: Mapping[str, str] | None = None) -> Any:
    """A JSON value's structure: dict keys kept (ids renamed through `aliases`), leaves as type names."""
    aliases = aliases or {}
    if isinstance(value, dict):
        return {aliases.get(k, k): shape(v, aliases) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v, aliases) for v in value]
    if isinstance(value, str) and _ELIDED.fullmatch(value):
        return WILDCARD
    if value is None:
        return "null"
    return type(value).__name__


def shape_diff(expected: Any, actual: Any, where: str = "$") -> list[str]:
    """Where two shapes differ. A list whose items all share one shape matches any non-empty list of
    that shape (a traceback has as many frames as it has); other lists compare item by item."""
    if WILDCARD in (expected, actual):
        return []
    if isinstance(expected, dict) and isinstance(actual, dict):
        problems = []
        if missing := sorted(expected.keys() - actual.keys()):
            problems.append(f"{where}: missing keys {missing}")
        if extra := sorted(actual.keys() - expected.keys()):
            problems.append(f"{where}: unexpected keys {extra}")
        for key in expected.keys() & actual.keys():
            problems += shape_diff(expected[key], actual[key], f"{where}.{key}")
        return problems
    if isinstance(expected, list) and isinstance(actual, list):
        if not expected or not actual:
            return [] if expected == actual else [f"{where}: {len(expected)} vs {len(actual)} items"]
        if _uniform(expected) and _uniform(actual):
            return shape_diff(expected[0], actual[0], f"{where}[*]")
        if len(expected) != len(actual):
            return [f"{where}: {len(expected)} vs {len(actual)} items"]
        return [
            p
            for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            for p in shape_diff(e, a, f"{where}[{i}]")
        ]
    return [] if expected == actual else [f"{where}: {expected!r} vs {actual!r}"]


def _uniform(items: list[Any]) -> bool:
    return all(item == items[0] for item in items)


def assert_same_shape(
    recorded: Any,
    actual: Any,
    recorded_ids: Mapping[str, str] | None = None,
    actual_ids: Mapping[str, str] | None = None,
) -> None:
    """Fail with every difference between the recorded value's shape and the actual one's."""
    problems = shape_diff(shape(recorded, recorded_ids), shape(actual, actual_ids))
    assert not problems, "shapes differ from the recording:\n" + "\n".join(problems)


def test_shape_diff_sees_what_matters() -> None:
    """The helper itself: keys and types count, ids (through aliases), lengths of uniform lists don't."""
    assert shape_diff(shape({"a": [1, 2], "b": "x"}), shape({"a": [3], "b": "y"})) == []
    assert shape_diff(shape({"a": 1}), shape({"a": "1"})) == ["$.a: 'int' vs 'str'"]
    assert shape_diff(shape({"a": 1}), shape({"a": 1, "b": 2})) == ["$: unexpected keys ['b']"]
    assert shape_diff(shape([]), shape(["x"])) == ["$: 0 vs 1 items"]
    assert shape_diff(shape([1, "a"]), shape([1, "a", "b"])) == ["$: 2 vs 3 items"]
    assert shape_diff(shape({"id1": 1}, {"id1": "<p>"}), shape({"id2": 1}, {"id2": "<p>"})) == []
    assert shape_diff(shape(["<prompt>"]), shape([{"1": {}}])) == []


# -- recordings and workflows -----------------------------------------------------------------------


def recording(name: str) -> dict[str, Any]:
    path = RECORDED / name
    return json.loads(path.read_text())


def recorded_workflow(name: str, color: int | None = None, prefix: str | None = None) -> dict[str, Any]:
    """A workflow from tests/recorded/workflows, with its EmptyImage colour/SaveImage prefix replaced."""
    prompt = recording(f"workflows/{name}")
    for node in prompt.values():
        if color is not None and node["class_type"] == "EmptyImage":
            node["inputs"]["color"] = color
        if prefix is not None and node["class_type"] == "SaveImage":
            node["inputs"]["filename_prefix"] = prefix
    return prompt


_colors = iter(random.sample(range(1, 1 << 24), 4096))


def fresh_color() -> int:
    """An EmptyImage colour no earlier prompt used, so a (real) server's cache never serves it."""
    return next(_colors)


def new_id(prefix: str = "") -> str:
    return prefix + str(uuid.uuid4())


# -- a plain client ------------------------------------------------------------------------------------


class Ws:
    """websocket-client with what the tests need: JSON/binary messages, reading until, a pong barrier."""

    def __init__(self, url: str, client_id: str | None = None) -> None:
        query = f"?clientId={client_id}" if client_id else ""
        self.conn = websocket.create_connection("ws" + url[len("http") :] + "/ws" + query, timeout=TIMEOUT)
        self.first = self.recv()

    def recv(self) -> dict[str, Any]:
        """The next data frame: a JSON message, or {"binary": bytes}."""
        opcode, payload = self.conn.recv_data()
        if opcode == websocket.ABNF.OPCODE_BINARY:
            return {"binary": payload}
        return json.loads(payload)

    def send(self, message: dict[str, Any]) -> None:
        self.conn.send(json.dumps(message))

    def until(self, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Messages up to and including the first for which `done` is true."""
        messages = []
        while True:
            message = self.recv()
            messages.append(message)
            if done(message):
                return messages

    def until_done(self, prompt_id: str) -> list[dict[str, Any]]:
        """Up to the prompt's final executing{node: null} (sent after its history is written)."""
        return self.until(
            lambda m: (
                kind(m) == "executing"
                and m["data"]["node"] is None
                and m["data"].get("prompt_id") == prompt_id
            )
        )

    def until_idle(self) -> list[dict[str, Any]]:
        """Up to a status saying the queue is empty (what a socket that hears only statuses waits for)."""
        return self.until(
            lambda m: kind(m) == "status" and m["data"]["status"]["exec_info"]["queue_remaining"] == 0
        )

    def before_pong(self) -> list[dict[str, Any]]:
        """Everything the server sent before it answered a ping: what it had sent so far."""
        self.conn.ping(b"barrier")
        messages = []
        while True:
            opcode, frame = self.conn.recv_data_frame(control_frame=True)
            if opcode == websocket.ABNF.OPCODE_PONG:
                return messages
            if opcode == websocket.ABNF.OPCODE_TEXT:
                messages.append(json.loads(frame.data))
            elif opcode == websocket.ABNF.OPCODE_BINARY:
                messages.append({"binary": frame.data})

    def close(self) -> None:
        self.conn.close(timeout=2)

    def __enter__(self) -> Ws:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def kind(message: dict[str, Any]) -> str:
    """A message's type; binary frames as binary:<event type>."""
    if "binary" in message:
        return f"binary:{struct.unpack('>I', message['binary'][:4])[0]}"
    return message["type"]


def kinds(messages: list[dict[str, Any]], without: tuple[str, ...] = ()) -> list[str]:
    return [kind(m) for m in messages if kind(m) not in without]


def recorded_kinds(entries: list[dict[str, Any]], without: tuple[str, ...] = ()) -> list[str]:
    """Kinds of recorded ws messages ({"json": ...} or {"binary": {"event_type_be_u32": n}})."""
    out = []
    for entry in entries:
        message = entry.get("json", entry)
        name = f"binary:{entry['binary']['event_type_be_u32']}" if "binary" in entry else message["type"]
        if name not in without:
            out.append(name)
    return out


def steps(messages: list[str]) -> list[str]:
    """Event kinds with statuses dropped and repeats collapsed: what a run did, not how many nodes it had."""
    out: list[str] = []
    for name in messages:
        if name != "status" and (not out or out[-1] != name):
            out.append(name)
    return out


def tokens(messages: list[dict[str, Any]]) -> list[str]:
    """Kinds, with the final executing{node: null} told apart from a node's executing."""
    return [
        ("executing:null" if kind(m) == "executing" and m["data"]["node"] is None else kind(m))
        for m in messages
    ]


@dataclass
class Target:
    """The server under test: the fake, or a real ComfyUI. `tune` sets the fake's knobs (a no-op for the
    real one) so that a scenario that needs a prompt still running can have one on the fake too."""

    kind: str
    url: str
    base: Path
    fake: FakeComfy | None = None

    def tune(self, **knobs: float) -> None:
        for name, value in knobs.items():
            if self.fake is not None:
                setattr(self.fake, name, value)

    def ws(self, client_id: str | None = None) -> Ws:
        return Ws(self.url, client_id)

    def get(self, path: str, **kw: Any) -> requests.Response:
        return requests.get(self.url + path, timeout=TIMEOUT, **kw)

    def post(self, path: str, **kw: Any) -> requests.Response:
        return requests.post(self.url + path, timeout=TIMEOUT, **kw)

    def prompt(
        self, prompt: Any, client_id: str | None = None, prompt_id: Any = OMIT, **extra: Any
    ) -> requests.Response:
        """POST /prompt; a prompt_id of None is sent as JSON null (leave it out to let the server choose)."""
        body: dict[str, Any] = {"prompt": prompt, **extra}
        if client_id is not None:
            body["client_id"] = client_id
        if prompt_id is not OMIT:
            body["prompt_id"] = prompt_id
        return self.post("/prompt", json=body)

    def queue_ids(self) -> tuple[list[str], list[str]]:
        queue = self.get("/queue").json()
        return [e[1] for e in queue["queue_running"]], [e[1] for e in queue["queue_pending"]]

    def barrier(self, *sockets: Ws, late: tuple[str, ...] = ()) -> None:
        """Assert that the sockets heard nothing since they were last read: a prompt without client id
        is posted, and the first thing each socket then hears must be its queued status.

        ``late``: prompts that finished just before; the real server sends their final executing{null}
        to their client after the idle status (0.3 s late when a gc pause falls there), and a socket that
        connected in between may hear it live. That is not a replay, so it is skipped."""
        response = self.prompt(trivial_prompt(fresh_color(), "barrier"))
        assert response.status_code == 200
        for ws in sockets:
            message = ws.recv()
            while kind(message) == "executing" and message["data"].get("node") is None \
                    and message["data"].get("prompt_id") in late:
                message = ws.recv()
            assert (
                kind(message) == "status" and message["data"]["status"]["exec_info"]["queue_remaining"] >= 1
            ), f"the socket heard {message} before the barrier"
            ws.until_idle()


@pytest.fixture(scope="session")
def real_comfyui(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """A real ComfyUI on the CPU when COMFYUI_DIR names a checkout (one per session: it starts slowly)."""
    if not COMFYUI_DIR:
        pytest.skip("set COMFYUI_DIR to a ComfyUI checkout that runs with --cpu to compare with the real one")
    base = tmp_path_factory.mktemp("real_comfyui")
    (base / "custom_nodes").mkdir()
    for node in (RECORDED / "custom_nodes").glob("*.py"):
        shutil.copy(node, base / "custom_nodes")
    port = free_port()
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    command = [
        python,
        str(Path(COMFYUI_DIR) / "main.py"),
        "--cpu",
        "--listen",
        "127.0.0.1",
        "--port",
        str(port),
        "--base-directory",
        str(base),
        "--disable-auto-launch",
    ]
    with open(base / "comfyui.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answering(url, process, 120)
        yield Target("real", url, base)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.comfyui)])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Target]:
    """Each recorded scenario runs against the fake and, when available, the real ComfyUI."""
    if request.param == "real":
        yield request.getfixturevalue("real_comfyui")
        return
    with FakeComfy(base_directory=tmp_path / "comfy", node_ms=5) as fake:
        yield Target("fake", fake.url, fake.base_directory, fake)


@pytest.fixture(autouse=True)
def no_leaked_fake_threads() -> Iterator[None]:
    """Every FakeComfy a test starts is stopped, and its thread gone, when the test ends."""
    yield
    leaked = [t for t in threading.enumerate() if t.name == "fake-comfy" and t.is_alive()]
    assert not leaked, f"leaked fake_comfy threads: {leaked}"


def free_port() -> int:
    """A port for a server started (or restarted) on it later, which no connection can take (port_support)."""
    return server_port()


def wait_until_answering(url: str, process: subprocess.Popen[bytes], seconds: float) -> None:
    """Poll /system_stats as the supervisor does to know a server is ready."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the server exited with {process.returncode} before answering")
        try:
            requests.get(url + "/system_stats", timeout=1).raise_for_status()
            return
        except requests.RequestException:
            time.sleep(0.05)
    process.kill()
    pytest.fail(f"{url} did not answer /system_stats within {seconds} s")


# -- the recorded scenarios ---------------------------------------------------------------------------


def test_success_matches_recording(server: Target) -> None:
    rec = recording("success.json")
    client_id, prompt_id = new_id(), new_id()
    recorded_ids = {rec["request"]["body"]["prompt_id"]: "<prompt_id>"}
    ids = {prompt_id: "<prompt_id>"}
    with server.ws(client_id) as ws:
        response = server.prompt(recorded_workflow("trivial.json", fresh_color()), client_id, prompt_id)
        assert response.status_code == rec["response"]["status"]
        assert response.headers["Content-Type"] == rec["response"]["content_type"]
        assert_same_shape(rec["response"]["body_json"], response.json())
        messages = ws.until_done(prompt_id)
    assert kinds(messages) == recorded_kinds(rec["ws_messages"])
    for recorded_message, message in zip(rec["ws_messages"], messages, strict=True):
        assert_same_shape(recorded_message["json"], message)
    history = server.get(f"/history/{prompt_id}")
    assert history.status_code == rec["history_response"]["status"]
    assert_same_shape(rec["history_response"]["body_json"], history.json(), recorded_ids, ids)

    image = history.json()[prompt_id]["outputs"]["3"]["images"][0]
    view = server.get("/view", params=image)
    assert view.status_code == rec["view"]["response"]["status"]
    assert view.content.startswith(b"\x89PNG\r\n\x1a\n")
    assert view.headers["Content-Type"] == "image/png"
    assert view.headers["Content-Disposition"] == f'filename="{image["filename"]}"'
    assert set(rec["view"]["response"]["headers"]) <= set(view.headers)
    for case in ("view_missing_file", "view_filename_with_dotdot", "view_subfolder_dotdot"):
        query = dict(rec[case]["query"])
        if case == "view_subfolder_dotdot":
            query["filename"] = image["filename"]
        answer = server.get("/view", params=query)
        assert (answer.status_code, answer.text) == (rec[case]["status"], rec[case]["body_text"]), case


def test_duplicate_ids_match_recording(server: Target) -> None:
    rec = recording("duplicate-id.json")
    client_id = new_id()
    with server.ws(client_id) as ws:
        for name, form in rec["prompt_id_forms"].items():
            response = server.prompt(
                recorded_workflow("trivial.json", fresh_color()), client_id, form["sent_prompt_id"]
            )
            assert response.status_code == form["status"], name
            assert_same_shape(form["response_json"], response.json())
            assert response.json()["prompt_id"] == form["response_json"]["prompt_id"], name
            ws.until_done(form["response_json"]["prompt_id"])
            history = server.get("/history/" + quote(form["response_json"]["prompt_id"], safe=""))
            assert history.status_code == form["GET /history/{quoted id} status"], name
            if history.status_code == 200:
                assert list(history.json()) == form["history keys"], name

    dup = rec["duplicate"]
    prompt_id = new_id()
    server.tune(
        node_ms=100
    )  # the recording used the slow workflow so that the second post found the first running
    with server.ws(client_id) as ws:
        first = server.prompt(recorded_workflow("slow.json", fresh_color()), client_id, prompt_id)
        seen = ws.until(lambda m: kind(m) == "execution_start")
        second = server.prompt(recorded_workflow("slow.json", fresh_color()), client_id, prompt_id)
        assert (first.status_code, second.status_code) == (200, 200)
        assert second.json()["number"] == first.json()["number"] + 1
        assert server.queue_ids() == ([prompt_id], [prompt_id])
        seen += ws.until_done(prompt_id)
        seen += ws.until_done(prompt_id)
    wanted = set(recorded_kinds(dup["ws_messages_both_runs"]))
    assert [k for k in kinds(seen) if k in wanted] == recorded_kinds(dup["ws_messages_both_runs"])
    outputs = [m["data"]["output"]["images"][0]["filename"] for m in seen if kind(m) == "executed"]
    assert len(outputs) == 2 and outputs[0] != outputs[1], "each run writes its own file"
    entry = server.get(f"/history/{prompt_id}").json()[prompt_id]
    assert entry["prompt"][0] == second.json()["number"], "the later run replaces the history entry"
    assert entry["outputs"]["3"]["images"][0]["filename"] == outputs[1]
    if server.fake is not None:
        record = server.fake.stats()["prompts"][prompt_id]
        assert (record["posted"], record["executed"]) == (2, 2)


def test_validation_errors_match_recording(server: Target) -> None:
    rec = recording("validation-error.json")
    with server.ws() as ws:
        for name, case in rec["cases"].items():
            body = dict(case["request"]["body"])
            if "prompt_id" in body:
                body["prompt_id"] = new_id()
            response = server.post("/prompt", json=body)
            expected = case["response"]
            assert response.status_code == expected["status"], name
            assert response.headers["Content-Type"] == expected["content_type"], name
            if "body_json" in expected:
                assert_same_shape(expected["body_json"], response.json())
                assert response.json()["error"]["type"] == expected["body_json"]["error"]["type"], name
                assert response.json()["node_errors"].keys() == expected["body_json"]["node_errors"].keys(), (
                    name
                )
            else:
                assert response.text == expected["body_text"], name
            if "prompt_id" in body:
                assert (
                    server.get(f"/history/{body['prompt_id']}").json() == case["GET /history/{id} afterwards"]
                )
        assert server.get("/queue").json() == rec["GET /queue afterwards"]
        server.barrier(ws)  # and no WebSocket message at all, not even a status


def test_invalid_json_bodies_match_recording(server: Target) -> None:
    raw = {"not_json_text": "this is not json", "empty_body": ""}
    for case in recording("invalid-json.json")["cases"]:
        request, expected = case["request"], case["response"]
        body = request.get("raw_body", raw.get(request["case"]))
        response = server.post(request["path"], data=body.encode())
        label = f"{request['path']} {request['case']}"
        assert response.status_code == expected["status"], label
        assert response.headers.get("Content-Type") == expected["content_type"], label
        if "body_json" in expected:
            assert response.json() == expected["body_json"], label
        else:
            assert response.text == expected["body_text"], label


def test_execution_error_matches_recording(server: Target) -> None:
    rec = recording("execution-error.json")
    a, b = new_id(), new_id()
    prompt_id = new_id()
    with server.ws(a) as ws_a, server.ws(b) as ws_b, server.ws() as ws_c:
        response = server.prompt(recorded_workflow("error_image_to_mask.json", fresh_color()), a, prompt_id)
        assert response.status_code == 200
        heard_a = ws_a.until_done(prompt_id)
        heard_b, heard_c = ws_b.until_idle(), ws_c.until_idle()
        assert kinds(heard_a) == recorded_kinds(rec["ws_messages_client_A_prompt_owner"])
        assert kinds(heard_b) == recorded_kinds(rec["ws_messages_client_B_other_clientId"])
        assert kinds(heard_c) == recorded_kinds(rec["ws_messages_client_C_no_clientId"])
        for recorded_message, message in zip(rec["ws_messages_client_A_prompt_owner"], heard_a, strict=True):
            assert_same_shape(recorded_message["json"], message)
        history = server.get(f"/history/{prompt_id}").json()
        recorded_ids = {rec["request"]["body"]["prompt_id"]: "<id>"}
        assert_same_shape(rec["history_response"]["body_json"], history, recorded_ids, {prompt_id: "<id>"})

        anonymous = rec["same_error_posted_without_client_id"]
        other_id = new_id()
        assert server.prompt(recorded_workflow("error_image_to_mask.json", fresh_color()), None, other_id).ok
        for ws, name in ((ws_a, "ws_A"), (ws_b, "ws_B"), (ws_c, "ws_C")):
            assert kinds(ws.until_idle()) == anonymous["ws_types_seen_by_A_B_C"][name]
        server.barrier(ws_a, ws_b, ws_c)  # nobody hears execution_error or executing afterwards either
        status = server.get(f"/history/{other_id}").json()[other_id]["status"]
        assert_same_shape(anonymous["history_status"], status)

        alloc = rec["cpu_allocation_failure"]
        alloc_id = new_id()
        prompt = alloc["request_prompt"]
        prompt["1"]["inputs"]["color"] = fresh_color()
        assert server.prompt(prompt, a, alloc_id).ok
        error = next(m for m in ws_a.until_done(alloc_id) if kind(m) == "execution_error")["data"]
        assert_same_shape(alloc["execution_error"], error)
        assert (error["exception_type"], error["node_type"]) == ("RuntimeError", "EmptyImage")
        assert "can't allocate memory" in error["exception_message"]


def test_interrupt_matches_recording(server: Target) -> None:
    rec = recording("interrupt.json")
    a, b = new_id(), new_id()
    p1, p2, p3 = new_id(), new_id(), new_id()
    server.tune(node_ms=150)
    with server.ws(a) as ws_a, server.ws(b) as ws_b:
        for pid in (p1, p2, p3):
            assert server.prompt(recorded_workflow("long.json", fresh_color()), a, pid).ok
        heard = ws_a.until(lambda m: kind(m) == "executing" and m["data"]["node"] == "10")
        queue = server.get("/queue").json()
        assert_same_shape(rec['GET /queue while P1 running (prompt dicts elided as "<prompt>")'], queue)
        assert server.queue_ids() == ([p1], [p2, p3])
        for body, name in (
            ({"prompt_id": p2}, "POST /interrupt {prompt_id: P2 (pending)}"),
            ({"prompt_id": new_id()}, "POST /interrupt {prompt_id: unknown}"),
        ):
            answer = server.post("/interrupt", json=body)
            assert (answer.status_code, answer.text) == (rec[name]["status"], rec[name]["body"])
        assert server.queue_ids() == ([p1], [p2, p3]), "interrupting a pending prompt changes nothing"
        for victim in (p3, p1):
            answer = server.post("/queue", json={"delete": [victim]})
            assert (answer.status_code, answer.text, answer.headers.get("Content-Type")) == (200, "", None)
        assert server.queue_ids() == ([p1], [p2]), "a running prompt is not deleted from the queue"
        heard += ws_a.until(lambda m: kind(m) == "executing" and m["data"]["node"] == "11")
        assert server.post("/interrupt", json={"prompt_id": p1}).status_code == 200
        server.tune(node_ms=5)
        heard += ws_a.until_done(p1)
        heard += ws_a.until_done(p2)
        heard_b = ws_b.before_pong()
        a_recorded = [
            row[1] for row in rec["ws_client_A [t_ms, type, prompt_id, node] (progress_state omitted)"]
        ]
        a_kinds = kinds(heard, without=("progress_state",))
        assert steps(a_kinds) == steps(a_recorded)
        assert a_kinds.count("status") == a_recorded.count("status")
        assert kinds(heard_b) == [row[1] for row in rec["ws_client_B [t_ms, type, prompt_id, node]"]]
        interrupted = next(m for m in heard if kind(m) == "execution_interrupted")
        assert_same_shape(rec["execution_interrupted message"], interrupted)
        assert interrupted["data"]["prompt_id"] == p1
        h1 = server.get(f"/history/{p1}").json()[p1]
        assert_same_shape(rec["history P1"], {k: h1[k] for k in ("status", "outputs")})
        assert (
            server.get(f"/history/{p2}").json()[p2]["status"]["status_str"]
            == rec["history P2 status_str (ran after P1)"]
        )
        assert server.get(f"/history/{p3}").json() == rec["history P3 (deleted before running)"]

        # A prompt without client id, stopped by a global interrupt: everyone hears execution_interrupted.
        anonymous = rec["prompt without client_id interrupted"]
        p4 = new_id()
        server.tune(node_ms=150)
        assert server.prompt(recorded_workflow("long.json", fresh_color()), None, p4).ok
        heard_a = ws_a.until(lambda m: kind(m) == "progress_state" and len(m["data"]["nodes"]) >= 2)
        assert (
            server.post("/interrupt", data=b"").status_code
            == rec["global interrupt (POST /interrupt with empty body)"]["status"]
        )
        server.tune(node_ms=5)
        heard_a += ws_a.until_idle()
        heard_b = ws_b.until_idle()
        assert kinds(heard_a, without=("progress_state",)) == [row[1] for row in anonymous["ws_A"]]
        assert kinds(heard_b, without=("progress_state",)) == [row[1] for row in anonymous["ws_B"]]
        raw = next(m for m in heard_b if kind(m) == "execution_interrupted")
        assert_same_shape(anonymous["execution_interrupted_raw_on_B"][0], raw)
        assert_same_shape(anonymous["history_status"], server.get(f"/history/{p4}").json()[p4]["status"])

        # POST /queue {clear}: the pending prompts go, the running one stays.
        clear = rec["POST /queue {clear: true}"]
        server.tune(node_ms=150)
        running, *pending = [new_id() for _ in range(3)]
        for pid in (running, *pending):
            assert server.prompt(recorded_workflow("long.json", fresh_color()), a, pid).ok
        ws_a.until(lambda m: kind(m) == "execution_start" and m["data"]["prompt_id"] == running)
        assert_same_shape(clear["before"], server.get("/queue").json())
        assert server.post("/queue", json={"clear": True}).status_code == clear["response_status"]
        assert_same_shape(clear["after"], server.get("/queue").json())
        assert server.queue_ids() == ([running], [])
        server.post("/interrupt", json={"prompt_id": running})
        server.tune(node_ms=5)
        ws_a.until_done(running)


def test_queue_matches_recording(server: Target) -> None:
    rec = recording("queue.json")
    assert server.get("/queue").json() == rec["GET /queue idle"]["body_json"]
    assert server.get("/prompt").json() == rec["GET /prompt idle"]["body_json"]
    order = rec["front_and_number"]
    client_id, blocker = new_id(), new_id()
    suffix = uuid.uuid4().hex[:6]
    ids = {name: f"{name}-{suffix}" for name in ("q-a", "q-b-front", "q-c-number-0.5", "q-d-number-str")}
    for _ in range(
        8
    ):  # rejected posts consume numbers too: the plain post's number must exceed 7, as recorded
        assert server.prompt({}).status_code == 400
    server.tune(node_ms=150)
    with server.ws(client_id) as ws:
        assert server.prompt(recorded_workflow("long.json", fresh_color()), client_id, blocker).ok
        ws.until(lambda m: kind(m) == "execution_start")
        running = server.get("/queue").json()["queue_running"][0]
        assert_same_shape(rec["GET /queue queue_running[0] full example"], running)
        extras = {
            "q-a": {},
            "q-b-front": {"front": True},
            "q-c-number-0.5": {"number": 0.5},
            "q-d-number-str": {"number": "7"},
        }
        answers = {}
        for (name, extra), recorded_answer in zip(extras.items(), order["responses"].values(), strict=True):
            answer = server.prompt(
                recorded_workflow("trivial.json", fresh_color()), client_id, ids[name], **extra
            )
            assert_same_shape(recorded_answer, answer.json())
            answers[name] = answer.json()["number"]
        assert answers["q-b-front"] == -(answers["q-a"] + 1)
        assert (answers["q-c-number-0.5"], answers["q-d-number-str"]) == (0.5, 7.0)
        pending = server.get("/queue").json()["queue_pending"]
        recorded_order = order["GET /queue queue_pending order ([number, id]; heap array order, NOT sorted)"]
        assert [entry[1] for entry in pending] == [ids[row[1]] for row in recorded_order]
        server.post("/interrupt", json={"prompt_id": blocker})
        server.tune(node_ms=5)
        started, finished = [], set()
        while finished != set(ids.values()):
            message = ws.recv()
            pid = message.get("data", {}).get("prompt_id")
            if kind(message) == "execution_start" and pid != blocker:
                started.append(pid)
            elif kind(message) == "executing" and message["data"]["node"] is None and pid != blocker:
                finished.add(pid)
    assert started == [ids[name] for name in order["execution order"]]


def test_system_routes_match_recording(server: Target) -> None:
    rec = recording("system-stats.json")
    stats = server.get("/system_stats")
    assert stats.status_code == 200
    assert_same_shape(rec["GET /system_stats"]["body_json"], stats.json())
    assert stats.json()["system"]["comfyui_version"] == "0.3.64"
    for route in (
        "GET /features",
        "GET /prompt",
        "GET /history/does-not-exist",
        "GET /object_info/NoSuchNode",
        "GET /api/jobs (no such route in this version; falls to the static handler)",
        "GET /api/internal/logs",
        "GET /models",
    ):
        expected = rec[route]
        answer = server.get(route.split()[1])
        assert (answer.status_code, answer.headers.get("Content-Type")) == (
            expected["status"],
            expected["content_type"],
        ), route
        if "json" in expected["content_type"]:
            assert_same_shape(expected["body"], answer.json())
            if route in ("GET /features", "GET /models", "GET /history/does-not-exist"):
                assert answer.json() == expected["body"], route
        else:
            assert answer.text == expected["body"], route
    not_allowed = server.post("/api/jobs")
    assert (not_allowed.status_code, not_allowed.text) == (405, rec["POST /api/jobs"]["body"])
    for body in ({"unload_models": True, "free_memory": True}, {}):
        answer = server.post("/free", json=body)
        assert (answer.status_code, answer.text, answer.headers.get("Content-Type")) == (200, "", None)


def test_history_matches_recording(server: Target) -> None:
    rec = recording("history.json")
    assert (server.post("/history", json={"clear": True}).status_code, server.get("/history").json()) == (
        200,
        {},
    )
    client_id = new_id()
    x, y, z = (new_id(f"hist-{name}-") for name in "xyz")
    with server.ws(client_id) as ws:
        for pid in (x, y, z, x):
            assert server.prompt(recorded_workflow("trivial.json", fresh_color()), client_id, pid).ok
            ws.until_done(pid)
    assert list(server.get("/history").json()) == [x, y, z], "a re-run keeps the id's old position"
    example_id = next(iter(rec["history entry example (GET /history/{Z})"]))
    assert_same_shape(
        rec["history entry example (GET /history/{Z})"],
        server.get(f"/history/{z}").json(),
        {example_id: "<id>"},
        {z: "<id>"},
    )
    numbers = {pid: entry["prompt"][0] for pid, entry in server.get("/history").json().items()}
    assert numbers[x] > numbers[z], "the re-run's number replaces the first one"
    for query, expected in (
        ({"max_items": 1}, [z]),
        ({"max_items": 2}, [y, z]),
        ({"max_items": 2, "offset": 0}, [x, y]),
    ):
        assert list(server.get("/history", params=query).json()) == expected, query
    bad = server.get("/history", params={"max_items": "abc"})
    assert (bad.status_code, bad.text) == (500, rec["GET /history?max_items=abc"]["body"])
    assert server.post("/history", json={"delete": [y]}).status_code == 200
    assert list(server.get("/history").json()) == [x, z]


def test_reconnect_matches_recording(server: Target) -> None:
    rec = recording("reconnect.json")
    with server.ws() as anonymous:
        assert_same_shape(rec["connect_without_clientId_first_message"], anonymous.first)
        assert re.fullmatch(r"[0-9a-f]{32}", anonymous.first["data"]["sid"])
    client_id, prompt_id = new_id(), new_id()
    with server.ws(client_id) as ws:
        assert_same_shape(rec["connect_with_clientId_first_message"], ws.first)
        assert ws.first["data"]["sid"] == client_id

    # Away mid-run: back comes a status with sid and a bare executing{node}, then live messages only.
    mid = rec["reconnect_mid_run"]
    server.tune(node_ms=150)
    ws = server.ws(client_id)
    assert server.prompt(recorded_workflow("long.json", fresh_color()), client_id, prompt_id).ok
    before = [ws.first, *ws.until(lambda m: kind(m) == "executing" and m["data"]["node"] == "11")]
    ws.close()
    with server.ws(client_id) as ws:
        after = [ws.first, ws.recv()]
        server.tune(node_ms=5)
        after += ws.until_done(prompt_id)
    assert kinds(before, ("progress_state",)) == recorded_kinds(mid["before_disconnect"])
    for recorded_message, message in zip(mid["after_reconnect"][:2], after[:2], strict=True):
        assert_same_shape(recorded_message["json"], message)
    live = [t for t in tokens(after[2:]) if t != "progress_state"]
    assert steps(live) == steps(tokens([e["json"] for e in mid["after_reconnect"][2:]]))

    # Away while it finished: only the status, no replay.
    away = rec["reconnect_after_prompt_finished_while_away"]
    finished_id = new_id()
    with server.ws() as observer:
        assert server.prompt(recorded_workflow("trivial.json", fresh_color()), client_id, finished_id).ok
        observer.until_idle()
        with server.ws(client_id) as ws:
            assert_same_shape(away["messages_after_reconnect"][0], ws.first)
            server.barrier(ws, observer, late=(finished_id,))
    assert (
        server.get(f"/history/{finished_id}").json()[finished_id]["status"]["status_str"]
        == away["history_status_str"]
    )

    # Two sockets with one client id: only the newer hears; when the older closes, the newer goes deaf.
    two = rec["two_sockets_same_clientId"]
    shared = new_id()
    with server.ws() as observer:
        old, new = server.ws(shared), server.ws(shared)
        first_id, second_id = new_id(), new_id()
        assert server.prompt(recorded_workflow("trivial.json", fresh_color()), shared, first_id).ok
        assert kinds(new.until_done(first_id)) == two["step1_both_open"]["new_socket_got"]
        assert old.before_pong() == two["step1_both_open"]["old_socket_got"]
        observer.until_idle()
        old.close()
        assert server.prompt(recorded_workflow("trivial.json", fresh_color()), shared, second_id).ok
        observer.until_idle()
        assert new.before_pong() == two["step2_after_old_closed"]["new_socket_got_after_old_closed"]
        new.close()
    assert (
        server.get(f"/history/{second_id}").json()[second_id]["status"]["status_str"]
        == two["step2_after_old_closed"]["history_status_str"]
    )

    handshake = rec["feature_flags_handshake"]
    with server.ws(new_id()) as ws:
        ws.send(handshake["client_sends_first"])
        assert ws.recv() == handshake["server_reply"]


def test_cache_matches_recording(server: Target) -> None:
    rec = recording("cached.json")["identical_workflow_twice"]
    client_id, color = new_id(), fresh_color()
    folder = server.base / "output" / "cachetest"
    noise = ("status", "progress_state")

    def run(prefix: str, recorded: dict[str, Any]) -> tuple[list[dict[str, Any]], int]:
        before = len(list(folder.glob("*.png"))) if folder.exists() else 0
        prompt_id = new_id()
        assert server.prompt(recorded_workflow("trivial.json", color, prefix), client_id, prompt_id).ok
        heard = [m for m in ws.until_done(prompt_id) if kind(m) not in noise]
        assert kinds(heard) == recorded_kinds(recorded["ws_messages"])
        for recorded_message, message in zip(recorded["ws_messages"], heard, strict=True):
            assert_same_shape(recorded_message, message)
        outputs = server.get(f"/history/{prompt_id}").json()[prompt_id]["outputs"]
        assert_same_shape(recorded["history_outputs"], outputs)
        return heard, len(list(folder.glob("*.png"))) - before

    with server.ws(client_id) as ws:
        first, written = run("cachetest/run", rec["first"])
        assert written == rec["first"]["files_in_output_subfolder_after"]
        second, written = run("cachetest/run", rec["second_identical"])
        assert written == rec["second_identical"]["new_files_written"]
        third, written = run("cachetest/other", rec["third_only_prefix_changed"])
        assert written == rec["third_only_prefix_changed"]["new_files_written"]

    def cached_nodes(heard: list[dict[str, Any]]) -> list[str]:
        return next(m for m in heard if kind(m) == "execution_cached")["data"]["nodes"]

    def filename(heard: list[dict[str, Any]]) -> dict[str, Any]:
        return next(m for m in heard if kind(m) == "executed")["data"]["output"]["images"][0]

    assert [cached_nodes(h) for h in (first, second, third)] == [
        rec[k]["ws_messages"][1]["data"]["nodes"]
        for k in ("first", "second_identical", "third_only_prefix_changed")
    ]
    assert filename(second) == filename(first), "a cached run replays the old file name"
    assert filename(third)["filename"].startswith("other_") and filename(third)["subfolder"] == "cachetest"
    view = server.get("/view", params=filename(first))
    assert (view.status_code, view.headers["Content-Type"]) == (200, "image/png")
    assert (
        server.get("/view", params={k: v for k, v in filename(first).items() if k != "type"}).status_code
        == 200
    )
    if server.fake is not None:
        cached_flags = [p["executions"][0]["cached"] for p in server.fake.stats()["prompts"].values()]
        assert cached_flags == [False, True, False], "a run served from the cache counts as executed, cached"


def test_progress_and_previews_match_recording(server: Target) -> None:
    rec = recording("progress-preview.json")
    for name, handshake in (
        ("client_without_feature_flags", False),
        ("client_sent_feature_flags_supports_preview_metadata", True),
    ):
        case = rec[name]
        client_id, prompt_id = new_id(), new_id()
        prompt = case["request"]["prompt"]
        prompt["1"]["inputs"]["color"] = fresh_color()
        with server.ws(client_id) as ws:
            if handshake:
                ws.send({"type": "feature_flags", "data": {"supports_preview_metadata": True}})
                assert kind(ws.recv()) == "feature_flags"
            assert server.prompt(prompt, client_id, prompt_id).ok
            heard = [m for m in ws.until_done(prompt_id) if kind(m) != "progress_state"]
        assert kinds(heard) == recorded_kinds(case["ws_messages"]), name
        frames = [m["binary"] for m in heard if "binary" in m]
        for frame, decoded in zip(frames, case["binary_frames_decoded"], strict=True):
            event, value = struct.unpack(">II", frame[:8])
            assert event == decoded["event_type"]
            if event == 1:
                assert value == decoded["image_type_u32"] and frame[8:12].hex() == decoded["image_magic_hex"]
            else:
                metadata = json.loads(frame[8 : 8 + value])
                assert_same_shape(decoded["metadata_json"], metadata)
                assert frame[8 + value : 12 + value].hex() == decoded["image_magic_hex"]
        json_messages = [m for m in heard if "binary" not in m]
        recorded_json = [e["json"] for e in case["ws_messages"] if "json" in e]
        for recorded_message, message in zip(recorded_json, json_messages, strict=True):
            assert_same_shape(recorded_message, message)
        outputs = server.get(f"/history/{prompt_id}").json()[prompt_id]["outputs"]
        assert_same_shape(case["history_outputs"], outputs)
        assert outputs["3"]["images"][0]["type"] == "temp"
        assert server.get("/view", params=outputs["3"]["images"][0]).status_code == 200


def test_object_info_matches_recorded_sample(server: Target) -> None:
    sample = recording("object-info-sample.json")["object_info"]
    everything = server.get("/object_info").json()
    for name, info in sample.items():
        assert server.get(f"/object_info/{name}").json() == {name: info}, name
        assert everything[name] == info, name


ANIMATED_CASES = ("animated_webp", "animated_webp_cached", "still_webp", "webm", "save_image_batch")
MAGIC = {"image/webp": b"RIFF", "video/webm": b"\x1a\x45\xdf\xa3", "image/png": b"\x89PNG"}


def test_animated_outputs_match_recording(server: Target) -> None:
    """SaveAnimatedWEBP (a batch, one image, the same batch again from the cache), SaveWEBM and a SaveImage batch,
    as a real 0.3.64 files them: one file under ``images`` with ``animated`` beside it, every message and history
    entry of the recorded shape (a cached replay's progress_state counts in integers), /view's content types."""
    rec = recording("animated-outputs.json")
    client_id, colors, executed = new_id(), {}, {}
    with server.ws(client_id) as ws:
        for name in ANIMATED_CASES:
            case = rec[name]
            prompt = json.loads(json.dumps(case["request"]["body"]["prompt"]))
            prompt["1"]["inputs"]["color"] = colors.setdefault(prompt["1"]["inputs"]["color"], fresh_color())
            prompt_id = new_id()
            assert server.prompt(prompt, client_id, prompt_id).status_code == case["response"]["status"]
            heard = [m for m in ws.until_done(prompt_id) if kind(m) != "status"]
            recorded = [m["json"] for m in case["ws_messages"] if m["json"]["type"] != "status"]
            assert kinds(heard) == kinds(recorded), name
            for recorded_message, message in zip(recorded, heard, strict=True):
                assert_same_shape(recorded_message, message)
            executed[name] = next(m for m in heard if kind(m) == "executed")["data"]["output"]
            recorded_id = case["request"]["body"]["prompt_id"]
            history = server.get(f"/history/{prompt_id}").json()
            assert_same_shape(case["history_response"]["body_json"], history, {recorded_id: "<p>"},
                              {prompt_id: "<p>"})
            outputs = history[prompt_id]["outputs"]
            assert outputs == {node: executed[name] for node in case["history_response"]["body_json"][recorded_id]
                               ["outputs"]}, name
            for position, view in enumerate(case["views"]):  # each case's files come from one node's one key
                item = outputs[view["node"]][view["key"]][position]
                answer = server.get("/view", params=item)
                assert (answer.status_code, answer.headers["Content-Type"]) == (view["status"], view["content_type"])
                assert answer.content.startswith(MAGIC[view["content_type"]]), name
                assert answer.headers["Content-Disposition"] == f'filename="{item["filename"]}"'
    assert executed["animated_webp"]["animated"] == [True] and executed["still_webp"]["animated"] == [False]
    assert executed["animated_webp_cached"] == executed["animated_webp"], "a cached run replays the old file"


# -- the script words, one by one, with a plain client ------------------------------------------------


@pytest.fixture
def fake(fake_comfy: FakeComfy) -> FakeComfy:
    """The conftest's started fake (tests/conftest.py, fake_comfy section)."""
    return fake_comfy


@dataclass
class Run:
    """What one prompt did, as a client sees it."""

    prompt_id: str
    response: requests.Response
    messages: list[dict[str, Any]]

    def first(self, name: str) -> dict[str, Any]:
        return next(m["data"] for m in self.messages if kind(m) == name)


def run_prompt(fake: FakeComfy, prompt: dict[str, Any] | None = None, prompt_id: str | None = None) -> Run:
    """Post with a client id and follow the prompt to its end (or return at once if the post failed)."""
    target = Target("fake", fake.url, fake.base_directory, fake)
    client_id, prompt_id = new_id(), prompt_id or new_id()
    with target.ws(client_id) as ws:
        response = target.prompt(prompt or trivial_prompt(fresh_color(), "word"), client_id, prompt_id)
        messages = ws.until_done(prompt_id) if response.ok else []
    return Run(prompt_id, response, messages)


def history_of(fake: FakeComfy, prompt_id: str) -> dict[str, Any]:
    return requests.get(f"{fake.url}/history/{prompt_id}", timeout=TIMEOUT).json().get(prompt_id, {})


def executions(fake: FakeComfy, prompt_id: str) -> list[dict[str, Any]]:
    return fake.stats()["prompts"][prompt_id]["executions"]


def test_word_ok_runs_every_node_then_succeeds(fake: FakeComfy) -> None:
    fake.script(["ok"])
    run = run_prompt(fake)
    assert [m["data"]["node"] for m in run.messages if kind(m) == "executing"] == ["1", "2", "3", None]
    assert steps(kinds(run.messages, ("progress_state",))) == [
        "execution_start",
        "execution_cached",
        "executing",
        "executed",
        "execution_success",
        "executing",
    ]
    entry = history_of(fake, run.prompt_id)
    assert entry["status"]["status_str"] == "success"
    image = entry["outputs"]["3"]["images"][0]
    assert (fake.output_directory / image["subfolder"] / image["filename"]).is_file()
    record = fake.stats()["prompts"][run.prompt_id]
    assert (record["posted"], record["executed"], record["executions"][0]["outcome"]) == (1, 1, "success")


def test_word_500_answers_plain_text_and_queues_nothing(fake: FakeComfy) -> None:
    fake.script(["500"])
    run = run_prompt(fake)
    assert (run.response.status_code, run.response.text) == (500, AIOHTTP_500)
    assert run.response.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert requests.get(f"{fake.url}/queue", timeout=TIMEOUT).json() == {
        "queue_running": [],
        "queue_pending": [],
    }
    record = fake.stats()["prompts"][run.prompt_id]
    assert (record["posted"], record["executed"], record["posts"][0]["status"]) == (1, 0, 500)
    assert run_prompt(fake, prompt_id=run.prompt_id).response.json()["number"] == 0, (
        "then ok; no number taken"
    )


def test_word_invalid_answers_the_recorded_validation_error(fake: FakeComfy) -> None:
    fake.script(["invalid"])
    with Ws(fake.url) as ws:
        run = run_prompt(fake)
        assert run.response.status_code == 400
        body = run.response.json()
        assert body["error"]["type"] == "prompt_outputs_failed_validation"
        assert body["node_errors"]["1"]["errors"][0]["type"] == "value_smaller_than_min"
        assert body["node_errors"]["1"]["dependent_outputs"] == ["3"]
        Target("fake", fake.url, fake.base_directory, fake).barrier(ws)
    assert fake.stats()["prompts"][run.prompt_id]["executed"] == 0


@pytest.mark.parametrize("word", ["error", "oom"])
def test_words_error_and_oom_fail_at_the_second_node(fake: FakeComfy, word: str) -> None:
    fake.script([word])
    run = run_prompt(fake)
    error = run.first("execution_error")
    assert (error["node_id"], error["node_type"], error["executed"]) == ("2", "ImageInvert", ["1"])
    assert list(error) == [
        "prompt_id",
        "node_id",
        "node_type",
        "executed",
        "exception_message",
        "exception_type",
        "traceback",
        "current_inputs",
        "current_outputs",
        "timestamp",
    ]
    if word == "error":
        assert error["exception_type"] == "IndexError"
        assert error["exception_message"] == "index 3 is out of bounds for dimension 3 with size 3\n"
    else:
        assert error["exception_type"] == "torch.OutOfMemoryError"
        assert "Allocation on device" in error["exception_message"]
        assert "CUDA out of memory. Tried to allocate" in error["exception_message"]
    entry = history_of(fake, run.prompt_id)
    assert (entry["status"]["status_str"], entry["outputs"]) == ("error", {})
    assert not list(fake.output_directory.glob("word_*.png")), "it never reached SaveImage"
    assert executions(fake, run.prompt_id)[0]["outcome"] == "error"


def test_word_drop_cuts_the_socket_at_the_first_node_and_finishes(fake: FakeComfy) -> None:
    fake.script(["drop"])
    client_id, prompt_id = new_id(), new_id()
    target = Target("fake", fake.url, fake.base_directory, fake)
    with Ws(fake.url) as observer:
        ws = Ws(fake.url, client_id)
        assert target.prompt(trivial_prompt(fresh_color(), "drop"), client_id, prompt_id).ok
        heard = []
        with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
            while True:
                heard.append(ws.recv())
        observer.until_idle()
    assert [m["data"]["node"] for m in heard if kind(m) == "executing"] == ["1"]
    assert history_of(fake, prompt_id)["status"]["status_str"] == "success"
    assert executions(fake, prompt_id)[0]["outcome"] == "success"


def test_word_hang_stops_at_the_second_node_until_interrupted(fake: FakeComfy) -> None:
    fake.script(["hang"])
    client_id, prompt_id = new_id(), new_id()
    target = Target("fake", fake.url, fake.base_directory, fake)
    with Ws(fake.url, client_id) as ws:
        assert target.prompt(trivial_prompt(fresh_color(), "hang"), client_id, prompt_id).ok
        ws.until(lambda m: kind(m) == "executing" and m["data"]["node"] == "2")
        for _ in range(3):  # many node times pass; it is still there, running, without a history
            assert target.queue_ids() == ([prompt_id], [])
            assert history_of(fake, prompt_id) == {}
        assert target.post("/interrupt", json={"prompt_id": prompt_id}).status_code == 200
        rest = ws.until_done(prompt_id)
    assert kinds(rest)[:2] == ["execution_interrupted", "status"]
    assert (rest[0]["data"]["node_id"], rest[0]["data"]["executed"]) == ("2", ["1"])
    assert history_of(fake, prompt_id)["status"]["status_str"] == "error"
    assert fake.stats()["interrupts"][-1] | {"at": 0} == {
        "at": 0,
        "prompt_id": prompt_id,
        "running": prompt_id,
        "effective": True,
    }


def test_word_slow_takes_ten_times_longer(fake: FakeComfy) -> None:
    fake.node_ms = 20
    fake.script(["ok", "slow"])

    def seconds(run: Run) -> float:
        return (
            run.first("execution_success")["timestamp"] - run.first("execution_start")["timestamp"]
        ) / 1000

    fast, slow = seconds(run_prompt(fake)), seconds(run_prompt(fake))
    assert slow >= 0.9 * 10 * 3 * 0.020, "three nodes, ten times 20 ms each"
    assert fast < slow / 2


def test_node_times_are_kept_against_execution_start(fake: FakeComfy) -> None:
    """A prompt lasts at least its nodes' time from execution_start to its end (late wake-ups are absorbed by the
    next node's deadline, never by running a node short; the last node ends early only by the fake's own
    bookkeeping after it, at most MAX_TAIL), and each executed node took its turn."""
    from fake_comfy.executor import MAX_TAIL

    fake.node_ms = 40
    fake.script(["ok", "slow"])
    run = run_prompt(fake)
    assert [m["data"]["node"] for m in run.messages if kind(m) == "executing"] == ["1", "2", "3", None]
    tail_ms = MAX_TAIL * 1000
    assert run.first("execution_success")["timestamp"] - run.first("execution_start")["timestamp"] >= 3 * 40 - tail_ms
    ran = executions(fake, run.prompt_id)[0]
    assert ran["ended_at"] - ran["started_at"] >= 3 * 0.040 - MAX_TAIL
    slow = run_prompt(fake, trivial_prompt(fresh_color(), "slow"))  # a fresh run starts its own clock
    took_ms = slow.first("execution_success")["timestamp"] - slow.first("execution_start")["timestamp"]
    assert took_ms >= 3 * 400 - tail_ms
    ran = executions(fake, slow.prompt_id)[0]
    assert ran["ended_at"] - ran["started_at"] >= 3 * 0.400 - MAX_TAIL


def test_word_crash_in_process_drops_everything_and_restarts_clean(fake: FakeComfy) -> None:
    fake.script(["crash"])
    port, client_id, prompt_id = fake.port, new_id(), new_id()
    ws = Ws(fake.url, client_id)
    assert (
        Target("fake", fake.url, fake.base_directory, fake)
        .prompt(trivial_prompt(fresh_color(), "crash"), client_id, prompt_id)
        .ok
    )
    heard = []
    with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
        while True:
            heard.append(ws.recv())
    assert [m["data"]["node"] for m in heard if kind(m) == "executing"] == ["1"]
    fake.stop()  # joins the thread that the crash ended
    assert fake.crashed and not fake.running
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{fake.url}/queue", timeout=TIMEOUT)
    stats = fake.stats()
    assert executions(fake, prompt_id)[0]["outcome"] == "crashed" and stats["servers"][-1]["crashed"]
    fake.start()
    assert (fake.port, fake.crashed) == (port, False)
    assert requests.get(f"{fake.url}/queue", timeout=TIMEOUT).json() == {
        "queue_running": [],
        "queue_pending": [],
    }
    assert history_of(fake, prompt_id) == {}, "a crash loses the running prompt"
    assert run_prompt(fake, prompt_id=prompt_id).first("execution_success")
    assert fake.stats()["prompts"][prompt_id]["executed"] == 2, "stats outlive the crash"


def test_word_hostile_names_files_outside_the_output_folder(fake: FakeComfy) -> None:
    fake.script(["hostile"])
    run = run_prompt(fake)
    images = run.first("executed")["output"]["images"]
    assert images == history_of(fake, run.prompt_id)["outputs"]["3"]["images"]
    assert any(".." in i["filename"] for i in images) and any(i["filename"].startswith("/") for i in images)
    assert any(".." in i["subfolder"] for i in images) and any(i["subfolder"].startswith("/") for i in images)
    for image in images:
        assert requests.get(f"{fake.url}/view", params=image, timeout=TIMEOUT).status_code in (400, 403)


def test_busy_prompts_block_until_interrupted(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path, busy=2) as fake:
        target = Target("fake", fake.url, fake.base_directory, fake)
        queue = target.get("/queue").json()
        assert [e[1] for e in queue["queue_running"]] == ["fake-busy-1"]
        assert [e[1] for e in queue["queue_pending"]] == ["fake-busy-2"]
        assert queue["queue_running"][0][3] == {"client_id": BUSY_CLIENT_ID}
        client_id, prompt_id = new_id(), new_id()
        with Ws(fake.url, client_id) as ws:
            assert ws.first["data"]["status"]["exec_info"]["queue_remaining"] == 2
            assert target.prompt(trivial_prompt(fresh_color(), "mine"), client_id, prompt_id).ok
            assert target.queue_ids() == (["fake-busy-1"], ["fake-busy-2", prompt_id])
            target.post("/interrupt", json={"prompt_id": "fake-busy-1"})
            for _ in ("busy-1 done", "busy-2 taken"):
                ws.until(
                    lambda m: kind(m) == "status" and m["data"]["status"]["exec_info"]["queue_remaining"] == 2
                )
            target.post("/queue", json={"delete": ["fake-busy-2"]})
            assert target.queue_ids() == (["fake-busy-2"], [prompt_id]), "the next one blocks in its turn"
            target.post("/interrupt", json={"prompt_id": "fake-busy-2"})
            ws.until_done(prompt_id)
        assert fake.stats()["busy"] == ["fake-busy-1", "fake-busy-2"]
        assert history_of(fake, prompt_id)["status"]["status_str"] == "success"
        assert [history_of(fake, f"fake-busy-{i}")["status"]["status_str"] for i in (1, 2)] == [
            "error",
            "error",
        ]


def test_script_by_id_follows_the_id_not_the_arrival_order(fake: FakeComfy) -> None:
    first, second = new_id(), new_id()
    fake.script_by_id({first: ["error"], second: ["ok", "oom"]})
    fake.script(["hang"])  # for ids without words of their own only
    assert run_prompt(fake, prompt_id=second).first("execution_success")
    assert run_prompt(fake, prompt_id=first).first("execution_error")["exception_type"] == "IndexError"
    assert (
        run_prompt(fake, prompt_id=second).first("execution_error")["exception_type"]
        == "torch.OutOfMemoryError"
    )
    assert run_prompt(fake, prompt_id=first).first("execution_success"), "past the end of its list: ok"
    assert [e["word"] for e in executions(fake, first)] == ["error", "ok"]
    with pytest.raises(ValueError, match="unknown script word"):
        fake.script(["explode"])


def test_script_file_is_shared_by_servers_and_restarts(tmp_path: Path) -> None:
    """One job scripted ["error", "ok"] fails once in total, whichever server it lands on."""
    prompt_id = new_id()
    script = tmp_path / "script.json"
    script.write_text(json.dumps({prompt_id: ["error", "ok"]}))
    with (
        FakeComfy(tmp_path / "a", script_file=script) as a,
        FakeComfy(tmp_path / "b", script_file=script) as b,
    ):
        assert run_prompt(a, prompt_id=prompt_id).first("execution_error")
        assert run_prompt(b, prompt_id=prompt_id).first("execution_success")
        other = new_id()
        script.write_text(json.dumps({prompt_id: ["error", "ok"], other: ["invalid"]}))  # read on every post
        assert run_prompt(b, prompt_id=other).response.status_code == 400
    with pytest.raises(ScriptError):
        FakeComfy(tmp_path / "c", script_file=tmp_path / "script.json.used")  # counts, not a script: {id: 2}


def test_history_is_written_after_success_with_the_configured_gap(fake: FakeComfy) -> None:
    fake.history_delay_ms = 600
    client_id, prompt_id = new_id(), new_id()
    target = Target("fake", fake.url, fake.base_directory, fake)
    with Ws(fake.url, client_id) as ws:
        assert target.prompt(trivial_prompt(fresh_color(), "race"), client_id, prompt_id).ok
        ws.until(lambda m: kind(m) == "execution_success")
        assert history_of(fake, prompt_id) == {}, "success arrives before the history is written"
        assert target.queue_ids() == ([prompt_id], []), "and the prompt still counts as running"
        ws.until_done(prompt_id)
    assert history_of(fake, prompt_id)["status"]["status_str"] == "success"


def test_interrupt_with_an_id_only_stops_that_prompt_while_it_runs(fake: FakeComfy) -> None:
    fake.script(["hang"])
    target = Target("fake", fake.url, fake.base_directory, fake)
    client_id, running, waiting = new_id(), new_id(), new_id()
    with Ws(fake.url, client_id) as ws:
        assert target.prompt(trivial_prompt(fresh_color(), "a"), client_id, running).ok
        assert target.prompt(trivial_prompt(fresh_color(), "b"), client_id, waiting).ok
        ws.until(lambda m: kind(m) == "executing" and m["data"]["node"] == "2")
        target.post("/interrupt", json={"prompt_id": waiting})
        target.post("/interrupt", json={"prompt_id": "nobody"})
        assert target.queue_ids() == ([running], [waiting])
        target.post("/interrupt", json={"prompt_id": running})
        ws.until_done(running)
        ws.until_done(waiting)
    effective = [(i["prompt_id"], i["effective"]) for i in fake.stats()["interrupts"]]
    assert effective == [(waiting, False), ("nobody", False), (running, True)]
    assert history_of(fake, waiting)["status"]["status_str"] == "success"


def test_history_keeps_the_newest_entries_up_to_its_cap(tmp_path: Path) -> None:
    """history.json: 10,005 posted, 10,001 kept (the cap is checked with > before inserting); scaled down."""
    assert MAXIMUM_HISTORY_SIZE == 10000
    with FakeComfy(tmp_path, max_history=4) as fake:
        ids = [f"hm-{i:05}" for i in range(9)]
        for pid in ids:
            run_prompt(fake, prompt_id=pid)
        kept = list(requests.get(f"{fake.url}/history", timeout=TIMEOUT).json())
    assert kept == ids[4:], "cap + 1 entries, the oldest evicted"


def test_loaders_pass_through_and_a_model_swap_takes_load_time(fake: FakeComfy) -> None:
    fake.load_ms = 150

    def workflow(model: str) -> dict[str, Any]:
        prompt = trivial_prompt(fresh_color(), "swap")
        prompt["4"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": model}}
        prompt["2"]["inputs"]["model_hint"] = [
            "4",
            0,
        ]  # an extra input ImageInvert ignores, linking the loader in
        prompt["5"] = {"class_type": "SomeCustomLoader", "inputs": {"model": ["4", 0], "lora_name": "x"}}
        prompt["6"] = {"class_type": "PreviewImage", "inputs": {"images": ["5", 0]}}
        return prompt

    durations = []
    for model in ("a.safetensors", "b.safetensors", "b.safetensors", "a.safetensors"):
        run = run_prompt(fake, workflow(model))
        assert run.response.status_code == 200, run.response.text
        durations.append(
            run.first("execution_success")["timestamp"] - run.first("execution_start")["timestamp"]
        )
    loads = [(load["class_type"], load["model"]) for load in fake.stats()["model_loads"]]
    assert loads == [
        ("CheckpointLoaderSimple", "a.safetensors"),
        ("SomeCustomLoader", "x"),
        ("CheckpointLoaderSimple", "b.safetensors"),
        ("CheckpointLoaderSimple", "a.safetensors"),
    ]
    # A swap sleeps its load time; the run that swapped nothing loaded nothing (the list above), whatever its
    # wall time on a loaded machine (183 ms once in the suite, with nothing to load).
    assert min(durations[0], durations[1], durations[3]) >= 150, "a swap costs load time"
    assert requests.get(f"{fake.url}/object_info/UNETLoader", timeout=TIMEOUT).json()["UNETLoader"][
        "category"
    ]


def test_validation_finds_what_comfyui_finds(fake: FakeComfy) -> None:
    target = Target("fake", fake.url, fake.base_directory, fake)

    def errors(mutate: Callable[[dict[str, Any]], None]) -> tuple[int, dict[str, Any]]:
        prompt = trivial_prompt(fresh_color(), "v")
        mutate(prompt)
        answer = target.prompt(prompt)
        return answer.status_code, answer.json()

    status, body = errors(lambda p: p["1"]["inputs"].update(width=99999))
    assert (status, body["node_errors"]["1"]["errors"][0]["type"]) == (400, "value_bigger_than_max")
    status, body = errors(lambda p: p["1"]["inputs"].pop("height"))
    assert body["node_errors"]["1"]["errors"][0]["type"] == "required_input_missing"
    status, body = errors(
        lambda p: p.update({"2": {"class_type": "MaskToImage", "inputs": {"mask": ["1", 0]}}})
    )
    assert body["node_errors"]["2"]["errors"][0]["type"] == "return_type_mismatch"
    status, body = errors(lambda p: p["3"]["inputs"].update(images=["9", 0]))
    assert body["node_errors"]["3"]["errors"][0]["type"] == "exception_during_validation"

    def purple_mask(prompt: dict[str, Any]) -> None:
        prompt["2"] = {"class_type": "ImageToMask", "inputs": {"image": ["1", 0], "channel": "purple"}}
        prompt["4"] = {"class_type": "MaskToImage", "inputs": {"mask": ["2", 0]}}
        prompt["3"]["inputs"]["images"] = ["4", 0]

    status, body = errors(purple_mask)
    assert body["node_errors"]["2"]["errors"][0]["type"] == "value_not_in_list"
    assert body["node_errors"]["2"]["dependent_outputs"] == ["3"]
    status, body = errors(lambda p: p["1"]["inputs"].update(width="64"))
    assert status == 200, "strings convert to INT as ComfyUI converts them"
    assert (
        target.prompt({"1": {"inputs": {}}})
        .json()["error"]["message"]
        .endswith("missing the class_type property.")
    )


def test_saved_images_are_real_pngs_in_the_colour_asked_for(fake: FakeComfy) -> None:
    run = run_prompt(fake, trivial_prompt(0xFF0000, "png/red"))
    image = history_of(fake, run.prompt_id)["outputs"]["3"]["images"][0]
    assert (image["filename"], image["subfolder"]) == ("red_00001_.png", "png")
    data = (fake.output_directory / "png" / "red_00001_.png").read_bytes()
    chunks = read_png(data)
    width, height, depth, colour_type = struct.unpack(">IIBB", chunks["IHDR"][:10])
    assert (width, height, depth, colour_type) == (64, 64, 8, 2)
    pixels = zlib.decompress(chunks["IDAT"])
    assert pixels[:4] == b"\x00" + bytes((0x00, 0xFF, 0xFF)), "ImageInvert of pure red"
    assert json.loads(chunks["tEXt"].split(b"\x00", 1)[1])["3"]["class_type"] == "SaveImage"
    again = run_prompt(fake, trivial_prompt(0x00FF00, "png/red"))
    assert history_of(fake, again.prompt_id)["outputs"]["3"]["images"][0]["filename"] == "red_00002_.png"


def read_png(data: bytes) -> dict[str, bytes]:
    """Chunks of a PNG, checking the signature and every CRC."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    chunks, offset = {}, 8
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        name, body = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        (crc,) = struct.unpack(">I", data[offset + 8 + length : offset + 12 + length])
        assert crc == zlib.crc32(name + body), name
        chunks.setdefault(name.decode(), body)
        offset += 12 + length
    assert "IEND" in chunks
    return chunks


def test_saving_outside_the_output_folder_is_comfyuis_error(fake: FakeComfy) -> None:
    run = run_prompt(fake, trivial_prompt(fresh_color(), "../../escape"))
    error = run.first("execution_error")
    assert error["exception_type"] == "Exception" and error["node_type"] == "SaveImage"
    assert error["exception_message"].startswith(
        "**** ERROR: Saving image outside the output folder is not allowed."
    )
    assert not list(fake.base_directory.parent.glob("escape*"))


def test_routes_answer_under_api_too(fake: FakeComfy) -> None:
    client_id, prompt_id = new_id(), new_id()
    ws = websocket.create_connection(
        f"ws://127.0.0.1:{fake.port}/api/ws?clientId={client_id}", timeout=TIMEOUT
    )
    try:
        assert json.loads(ws.recv())["data"]["sid"] == client_id
        body = {
            "prompt": trivial_prompt(fresh_color(), "api"),
            "client_id": client_id,
            "prompt_id": prompt_id,
        }
        assert requests.post(f"{fake.url}/api/prompt", json=body, timeout=TIMEOUT).ok
        while json.loads(ws.recv())["type"] != "execution_success":
            pass
    finally:
        ws.close()
    assert prompt_id in requests.get(f"{fake.url}/api/history", timeout=TIMEOUT).json()
    assert (
        requests.get(f"{fake.url}/api/fake/stats", timeout=TIMEOUT).json()["prompts"][prompt_id]["posted"]
        == 1
    )


def test_control_route_scripts_a_running_fake(fake: FakeComfy) -> None:
    control = f"{fake.url}/fake/control"
    assert requests.post(control, json={"script": ["error"], "history_delay_ms": 1}, timeout=TIMEOUT).ok
    assert fake.history_delay_ms == 1
    assert run_prompt(fake).first("execution_error")
    bad = requests.post(control, json={"script_by_id": {"x": ["boom"]}}, timeout=TIMEOUT)
    assert bad.status_code == 400 and "boom" in bad.json()["error"]


def test_stop_is_idempotent_and_leaves_nothing_listening(tmp_path: Path) -> None:
    fake = FakeComfy(tmp_path).start()
    port, ws = fake.port, Ws(fake.url, new_id())
    fake.stop()
    fake.stop()
    with pytest.raises((websocket.WebSocketConnectionClosedException, ConnectionError)):
        ws.recv()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/queue", timeout=TIMEOUT)
    with FakeComfy(tmp_path, port=port) as again:
        assert again.port == port, "the port is free again at once"
        with pytest.raises(OSError):
            FakeComfy(tmp_path, port=port).start()


# -- the command line ---------------------------------------------------------------------------------


def start_cli(
    args: list[str], cwd: Path, module: bool = False, main: Path = ROOT / "fake_comfy" / "main.py"
) -> tuple[subprocess.Popen[str], str, list[str]]:
    """Run the fake as the supervisor would; wait for its "To see the GUI" line; (process, url, lines)."""
    entry = ["-m", "fake_comfy"] if module else [str(main)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    process = subprocess.Popen(
        [sys.executable, *entry, *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if match := re.match(r"To see the GUI go to: (http://\S+)", line):
            return process, match.group(1), lines
    process.wait(TIMEOUT)
    pytest.fail(
        f"no startup line; exit {process.returncode}: {process.stderr.read() if process.stderr else ''}"
    )


@pytest.mark.timeout(30)
def test_cli_takes_comfyuis_command_line_and_stops_as_recorded(tmp_path: Path) -> None:
    """A checkout's fake_comfy/main.py run as a plain script (no install used), as ComfyUI's main.py is."""
    timing = RECORDED / "timing.json"  # killed by SIGTERM (-15): ComfyUI installs no handler
    sigterm_exit = (
        json.loads(timing.read_text())["startup_and_memory"][0]["exit_code"] if timing.is_file() else -15
    )
    checkout = tmp_path / "checkout"
    shutil.copytree(
        ROOT / "fake_comfy", checkout / "fake_comfy", ignore=shutil.ignore_patterns("__pycache__")
    )
    base = tmp_path / "base"
    args = [
        "--listen",
        "127.0.0.1",
        "--port",
        "0",
        "--base-directory",
        str(base),
        "--cuda-device",
        "1",
        "--extra-model-paths-config",
        "a.yaml",
        "b.yaml",
        "--database-url",
        "sqlite:///x.db",
        "--disable-auto-launch",
        "--preview-method",
        "auto",
        "--highvram",
        "--node-ms",
        "1",
    ]
    process, url, lines = start_cli(args, cwd=tmp_path, main=checkout / "fake_comfy" / "main.py")
    try:
        assert f"from {checkout / 'fake_comfy'}," in lines[0], "the checkout's copy, not an installed package"
        stats = requests.get(f"{url}/system_stats", timeout=TIMEOUT).json()
        assert stats["system"]["argv"] == ["main.py", *args]
        assert stats["devices"][0]["type"] == "cuda"
        body = {"prompt": trivial_prompt(fresh_color(), "cli"), "client_id": new_id()}
        with Ws(url, body["client_id"]) as ws:
            prompt_id = requests.post(f"{url}/prompt", json=body, timeout=TIMEOUT).json()["prompt_id"]
            ws.until_done(prompt_id)
        assert (base / "output" / "cli_00001_.png").is_file()
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(TIMEOUT) == sigterm_exit


@pytest.mark.timeout(30)
def test_cli_crash_word_kills_the_process(tmp_path: Path) -> None:
    process, url, _ = start_cli(
        ["--port", "0", "--base-directory", str(tmp_path), "--script", "ok,crash", "--cpu"],
        cwd=ROOT,
        module=True,
    )
    try:
        with Ws(url) as observer:
            requests.post(
                f"{url}/prompt", json={"prompt": trivial_prompt(fresh_color(), "c")}, timeout=TIMEOUT
            )
            observer.until_idle()
            requests.post(
                f"{url}/prompt", json={"prompt": trivial_prompt(fresh_color(), "c")}, timeout=TIMEOUT
            )
        assert process.wait(TIMEOUT) == -signal.SIGKILL
    finally:
        process.kill()
        process.wait(TIMEOUT)


@pytest.mark.timeout(30)
def test_cli_exits_1_when_the_port_is_taken_and_2_on_a_bad_script(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                str(ROOT / "fake_comfy" / "main.py"),
                "--port",
                str(port),
                "--base-directory",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
    assert result.returncode == 1 and "bind" in result.stderr
    result = subprocess.run(
        [sys.executable, "-m", "fake_comfy", "--script", "ok,explode"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert result.returncode == 2 and "explode" in result.stderr


def test_parse_options_honours_comfyuis_flags_and_ignores_the_rest(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"x": ["oom"]}))
    options = parse_options(
        [
            "--listen",
            "--port",
            "8190",
            "--cpu",
            "--base-directory",
            str(tmp_path),
            "--output-directory",
            str(tmp_path / "out"),
            "--busy",
            "3",
            "--history-delay-ms",
            "250",
            "--script",
            "500,hang",
            "--script-file",
            str(script),
            "--fast",
            "fp16_accumulation",
            "--front-end-version",
            "Comfy-Org/ComfyUI_frontend@latest",
        ]
    )
    assert (options.listen, options.port, options.cpu, options.busy) == ("0.0.0.0,::", 8190, True, 3)
    assert (options.history_delay_ms, options.script, options.script_file) == (250.0, ["500", "hang"], script)
    assert options.output_dir == tmp_path / "out" and options.temp_dir == tmp_path / "temp"
