"""comfysup.comfy.wire: the shapes a real ComfyUI sends pass unchanged in what the runner reads, and any
other value anywhere is a Malformed with a readable text — never another exception."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comfysup.comfy import wire
from comfysup.comfy.wire import Malformed
from comfysup.jobs.catalogue import first_issue
from comfysup.jobs.graph import ObjectInfo

pytestmark = pytest.mark.timeout(120)
HUGE = "1" + "0" * 400
"""An int JSON parses but no float holds (math.isfinite of it overflows)."""
RECORDED = Path(__file__).resolve().parents[1] / "recorded"  # tests/recorded: refresh it with tests/recorded/refresh


def recorded(name: str) -> dict[str, Any]:
    return json.loads((RECORDED / name).read_text())


def all_ws_messages() -> list[dict[str, Any]]:
    out = []
    for name in ("success.json", "execution-error.json", "progress-preview.json", "cached.json", "reconnect.json"):
        stack: list[Any] = [recorded(name)]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                if isinstance(item.get("json"), dict) and "type" in item["json"]:
                    out.append(item["json"])
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return out


def test_every_recorded_message_passes_with_the_fields_the_runner_reads() -> None:
    messages = all_ws_messages()
    kinds = {m["type"] for m in messages}
    assert {"status", "execution_start", "executing", "executed", "execution_success", "execution_error",
            "progress"} <= kinds, kinds
    for message in messages:
        got = wire.ws_message(json.dumps(message))
        if message["type"] not in wire._EVENTS and message["type"] != "status":
            assert got is None
            continue
        assert got is not None and got["type"] == message["type"]
        for key in ("prompt_id", "node", "value", "max", "exception_type", "exception_message", "node_id",
                    "node_type"):
            if key in message["data"] and key in got["data"]:
                want = message["data"][key]
                assert got["data"][key] == (str(want) if key in ("node", "node_id") and want is not None else want)


def test_the_recorded_history_entries_pass() -> None:
    success = recorded("success.json")["history_response"]["body_json"]
    [prompt_id] = success
    entry = wire.history_entry(success, prompt_id)
    assert entry is not None
    assert entry["status"]["status_str"] == "success" and entry["prompt"] == [0]
    assert entry["outputs"]["3"]["images"] == [{"filename": "comfysup_00001_.png", "subfolder": "",
                                                "type": "output"}]
    failed = recorded("execution-error.json")["history_response"]["body_json"]
    [failed_id] = failed
    entry = wire.history_entry(failed, failed_id)
    assert entry is not None and entry["status"]["status_str"] == "error"
    kinds = [m[0] for m in entry["status"]["messages"]]
    assert "execution_error" in kinds
    error = dict(entry["status"]["messages"])["execution_error"]
    assert error["exception_type"] and error["node_type"]
    assert wire.history_entry({}, prompt_id) is None  # not written yet


def test_the_recorded_queue_and_stats_pass() -> None:
    stats = wire.system_stats(recorded("system-stats.json")["GET /system_stats"]["body_json"])
    assert stats["system"]["comfyui_version"] == "0.3.64" and stats["devices"][0]["type"] == "cpu"
    body = recorded("queue.json")["GET /queue while running (prompt dicts elided)"]
    assert [(n, running) for n, _, _, running in wire.queue(body)] == [(39, True), (40, False), (41, False)]
    assert wire.queue(body)[0][2] == "38cd78a9-7113-42d9-8aad-03beff9c43b7"


@pytest.mark.parametrize(("raw", "message"), [
    ('{"type": "executing", "data": ["a"]}', "the executing message's data is a list, not an object"),
    ('{"type": "progress", "data": {"prompt_id": "p", "node": "2", "value": Infinity, "max": 10}}',
     "Infinity is not a number"),
    ('{"type": "progress", "data": {"prompt_id": "p", "node": "2", "value": 1e999, "max": 10}}',
     "not a finite number"),
    ('{"type": "progress", "data": {"prompt_id": "p", "node": "2", "value": 99999999999999999999, "max": 10}}',
     "value is out of range"),
    ('{"type": "progress", "data": {"prompt_id": "p", "node": "2", "value": ' + HUGE + ', "max": 10}}',
     "value is out of range"),
    ('{"type": "progress", "data": {"prompt_id": "p", "node": "2", "value": "3", "max": 10}}',
     "value is a str, not a number"),
    ('{"type": "execution_start", "data": {"prompt_id": 7}}', "prompt_id is a int, not a string"),
    ('{"type": 5}', "type is a int"),
    ('[1, 2]', "a WebSocket message is a list"),
    ("not json", "a WebSocket message is not JSON"),
    ('{"type": "executed"' + ', "x": ' + "[" * 200_000 + "]" * 200_000 + "}", "nested too deeply"),
    ('{"type": "status", "data": {"status": "busy"}}', "the status message's status is a str"),
    ('{"type": "executed", "data": {"prompt_id": "p", "node": "1", "output": [1]}}', "output is a list"),
])
def test_malformed_messages_say_what_is_wrong(raw: str, message: str) -> None:
    with pytest.raises(Malformed) as info:
        wire.ws_message(raw)
    assert message in str(info.value), str(info.value)


def test_unknown_message_types_are_tolerated() -> None:
    assert wire.ws_message('{"type": "assets.seed.started", "data": [1, 2]}') is None
    assert wire.ws_message('{"type": "crystools.monitor", "data": {"cpu": 3}}') is None
    # progress_state is not read (the trace is made of executing and progress): whatever it holds passes unread
    assert wire.ws_message('{"type": "progress_state", "data": {"prompt_id": "p", "nodes": {"2": {"value": '
                           + HUGE + '}}}}') is None


def test_a_message_whose_first_bytes_name_a_type_not_read_is_passed_over_unparsed() -> None:
    # ComfyUI's send_json puts the type first: such a message is not decoded at all, whatever follows it.
    assert wire.ws_message(b'{"type": "progress_state", "data": {"nodes": [[[[ not even json') is None
    assert wire.ws_message(b'{"type": "crystools.monitor", "data": ' + b"[" * 100_000) is None
    # A type the runner reads is decoded and checked whole, in bytes as in text.
    with pytest.raises(Malformed, match="not JSON"):
        wire.ws_message(b'{"type": "executing", "data": {"node": ')
    with pytest.raises(Malformed, match="not JSON"):
        wire.ws_message(b'{"type": "status", "data": ')
    # A type written with an escape is no plain type: decoded whole, and here it is "executing".
    with pytest.raises(Malformed, match="node is a dict"):
        wire.ws_message(b'{"type": "exec\\u0075ting", "data": {"prompt_id": "p", "node": {}}}')
    # Another spacing than ComfyUI's is decoded whole too.
    assert wire.ws_message(b'{"type":"executing","data":{"prompt_id":"p","node":null}}') == {
        "type": "executing", "data": {"prompt_id": "p", "node": None}}


GOOD_ENTRY = {"p": {"prompt": [3, "p", {}, {}, ["3"]], "outputs": {"3": {"images": [
    {"filename": "a.png", "subfolder": "", "type": "output"}]}},
    "status": {"status_str": "success", "completed": True, "messages": [["execution_start", {"prompt_id": "p"}]]}}}


@pytest.mark.parametrize(("path", "value", "message"), [
    ((), "oops", "/history is a str, not an object"),
    (("p",), "a string", "/history entry is a str, not an object"),
    (("p", "status"), "success", "/history entry's status is a str, not an object"),
    (("p", "status", "status_str"), 3, "status_str is a int, not a string"),
    (("p", "status", "messages"), {"a": 1}, "status messages is a dict, not a list"),
    (("p", "status", "messages", 0), "execution_start", "status message 0 is a str, not a list"),
    (("p", "status", "messages", 0, 1), [], "status message 0 (execution_start) is a list"),
    (("p", "outputs"), [], "outputs is a list, not an object"),
    (("p", "outputs", "3"), "x", "outputs of node 3 is a str"),
    (("p", "outputs", "3", "images", 0, "filename"), ["a"], "filename is a list, not a string"),
    (("p", "outputs", "3", "images", 0, "subfolder"), 5, "subfolder is a int"),
    (("p", "prompt"), "3", "prompt is a str, not a list"),
    (("p", "prompt", 0), "3", "prompt number is str"),
    (("p", "prompt", 0), 2**60, "prompt number is out of range"),
])
def test_malformed_history_says_where(path: tuple[Any, ...], value: Any, message: str) -> None:
    body = copy.deepcopy(GOOD_ENTRY)
    if path:
        target: Any = body
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    else:
        body = value
    with pytest.raises(Malformed) as info:
        wire.history_entry(body, "p")
    assert message in str(info.value), str(info.value)


def test_a_history_naming_too_many_files_is_malformed() -> None:
    body = copy.deepcopy(GOOD_ENTRY)
    body["p"]["outputs"]["3"]["images"] = [{"filename": f"{i}.png"} for i in range(11)]
    with pytest.raises(Malformed, match="more than 10 files"):
        wire.history_entry(body, "p", max_files=10)
    assert len(wire.history_entry(body, "p", max_files=11)["outputs"]["3"]["images"]) == 11


@pytest.mark.parametrize("body", [
    "x", [], {"queue_running": "x"}, {"queue_running": [["a", "p"]]}, {"queue_pending": [[1]]},
    {"queue_pending": [[1, 2]]}, {"queue_running": [5]},
])
def test_malformed_queues(body: Any) -> None:
    with pytest.raises(Malformed):
        wire.queue(body)


def test_decode_refuses_what_json_would_let_through() -> None:
    for raw, message in ((b"NaN", "NaN is not a number"), (b"[1e400]", "not a finite number"),
                         (b"\xff\xfe", "not JSON"), (b"1" * 5000, "not JSON"), (b"{", "not JSON")):
        with pytest.raises(Malformed, match=message):
            wire.decode(raw, "x")


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.integers(min_value=10**300)
                    | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=5), lambda children: st.lists(children, max_size=3)
                    | st.dictionaries(st.text(max_size=8), children, max_size=3), max_leaves=8)
KEYS = st.sampled_from(["prompt", "status", "status_str", "messages", "outputs", "3", "images", "filename",
                        "subfolder", "type", "data", "node", "value", "max", "prompt_id", "nodes", "exec_info",
                        "queue_remaining", "queue_running", "queue_pending", "exception_message", "traceback"])


def mutate(value: Any, path: list[int], replacement: Any, key: str) -> Any:
    """``value`` with one node (chosen by ``path``) replaced, or given one more key."""
    if not path or not isinstance(value, dict | list) or not value:
        if isinstance(value, dict) and path:
            return {**value, key: replacement}
        return replacement
    i = path[0] % len(value)
    if isinstance(value, dict):
        k = list(value)[i]
        return {**value, k: mutate(value[k], path[1:], replacement, key)}
    return [*value[:i], mutate(value[i], path[1:], replacement, key), *value[i + 1:]]


SAMPLES = [("history", GOOD_ENTRY)] + [("ws", m) for m in all_ws_messages()[:40]] + [
    ("queue", {"queue_running": [[1, "p", {}, {"client_id": "c"}, []]], "queue_pending": [[2, "q", {}, {}, []]]}),
    ("stats", recorded("system-stats.json")["GET /system_stats"]["body_json"]),
    ("history list", {"p": GOOD_ENTRY, "q": GOOD_ENTRY})]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample=st.sampled_from(SAMPLES), path=st.lists(st.integers(0, 50), max_size=6), replacement=JSON,
       key=KEYS)
def test_any_value_anywhere_is_a_result_or_malformed(sample: tuple[str, Any], path: list[int], replacement: Any,
                                                      key: str) -> None:
    kind, body = sample
    body = mutate(body, path, replacement, key)
    try:
        if kind == "history":
            wire.history_entry(body, "p")
        elif kind == "ws":
            wire.ws_message(json.dumps(body))
        elif kind == "queue":
            wire.queue(body)
        elif kind == "history list":
            numbers = wire.history_numbers(body)
            assert all(isinstance(k, str) and isinstance(v, int) for k, v in numbers.items())
        else:
            wire.system_stats(body)
    except Malformed as exc:
        assert str(exc)


CATALOGUE = recorded("object-info-sample.json")["object_info"]
WORKFLOWS = [json.loads((RECORDED / "workflows" / name).read_text())
             for name in ("trivial.json", "load_image_invert.json", "invalid_value.json")]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.lists(st.integers(0, 50), max_size=6), replacement=JSON, key=KEYS,
       workflow=st.sampled_from(WORKFLOWS))
def test_any_catalogue_is_malformed_or_checks_a_job_without_an_exception(path: list[int], replacement: Any,
                                                                        key: str, workflow: Any) -> None:
    """A runner checks every claim against its server's /object_info: a damaged one (a class's ``input`` a
    number, CI seed 2873647724 of chaos H1) must be refused at the wire, not crash the runner at the check."""
    body = mutate(CATALOGUE, path, replacement, key)
    try:
        info = wire.object_info(body)
    except Malformed as exc:
        assert str(exc)
        return
    first_issue(workflow, info)
    catalogue = ObjectInfo(info)  # the submit side reads the same recorded catalogue
    for name in info:
        catalogue.inputs(name)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("EmptyImage", "input"), 7, "/object_info EmptyImage.input is a int, not an object"),
    (("EmptyImage", "input", "required"), [], "/object_info EmptyImage.input.required is a list, not an object"),
    (("SaveImage", "input", "optional"), "x", "/object_info SaveImage.input.optional is a str, not an object"),
    (("EmptyImage", "input"), None, "/object_info EmptyImage.input is a null, not an object"),
    (("EmptyImage", "input", "required"), None, "/object_info EmptyImage.input.required is a null, not an object"),
])
def test_a_catalogue_with_a_section_of_the_wrong_shape_says_where(path: tuple[str, ...], value: Any,
                                                                   message: str) -> None:
    body = copy.deepcopy(CATALOGUE)
    place = body
    for key in path[:-1]:
        place = place[key]
    place[path[-1]] = value
    with pytest.raises(Malformed, match="^" + message.replace(".", r"\.") + "$"):
        wire.object_info(body)
