"""comfysup.runner.catalogue.ServerCatalogue: a malformed /object_info is asked again after RETRY_SECONDS, not
before every claim; a server that does not answer is asked again at once; a server seen down is read at once."""

from __future__ import annotations

from typing import Any

import pytest

from comfysup.comfy import MalformedAnswer, ServerUnavailable
from comfysup.runner import catalogue as catalogue_module
from comfysup.runner.catalogue import ServerCatalogue

pytestmark = pytest.mark.timeout(30)


class Client:
    def __init__(self, answers: list[Any]) -> None:
        self.answers, self.asked = answers, 0

    def object_info(self) -> dict[str, Any]:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Fleet:
    def record_catalogue(self, server: str, machine: str, info: dict[str, Any]) -> int:
        return 7


class Queue:
    fleet = Fleet()


def test_a_malformed_catalogue_waits_its_retry_and_a_server_down_is_asked_again_at_once() -> None:
    now = [100.0]
    client = Client([MalformedAnswer("server sent a malformed /object_info X.input is a int, not an object"),
                     ServerUnavailable("GET /object_info: refused", "connection"), {"X": {"input": {}}}])
    cat = ServerCatalogue(Queue(), client, "cpu0", clock=lambda: now[0])  # type: ignore[arg-type]
    cat.refresh()
    cat.refresh()
    cat.refresh()
    assert client.asked == 1  # not before every claim
    now[0] += catalogue_module.RETRY_SECONDS
    cat.refresh()  # the server is down now: asked again at the next chance, without waiting
    assert client.asked == 2 and cat.stale
    cat.refresh()
    assert client.asked == 3 and not cat.stale and cat.id == 7


def test_a_server_seen_down_is_read_at_once_even_within_a_retry_wait() -> None:
    now = [0.0]
    client = Client([MalformedAnswer("bad"), {"X": {"input": {}}}])
    cat = ServerCatalogue(Queue(), client, "cpu0", clock=lambda: now[0])  # type: ignore[arg-type]
    cat.refresh()
    cat.server_down()
    cat.refresh()
    assert client.asked == 2 and cat.id == 7


def test_only_inputs_are_kept_and_a_class_without_any_is_checked_as_having_none() -> None:
    """The wire lets a class without an "input" section through; keeping only the inputs must not crash on it (the
    refresh runs before the runner's loop: a crash there would restart the runner into the same answer)."""
    from comfysup.comfy import wire
    from comfysup.jobs.catalogue import first_issue

    info = wire.object_info({"Bare": {"output": ["IMAGE"], "description": "x" * 100},
                             "Full": {"input": {"required": {"n": ["INT", {"min": 0}]}}, "category": "c"}})
    cat = ServerCatalogue(Queue(), Client([info]), "cpu0")  # type: ignore[arg-type]
    cat.refresh()
    assert cat.info == {"Bare": {"input": None}, "Full": {"input": {"required": {"n": ["INT", {"min": 0}]}}}}
    assert first_issue({"1": {"class_type": "Bare", "inputs": {}}}, cat.info) is None
    issue = first_issue({"1": {"class_type": "Full", "inputs": {}}}, cat.info)
    assert issue is not None and issue.kind == "required_input_missing"
