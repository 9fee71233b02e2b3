"""comfysup.comfy.KnownRuns: what a runner's client knows its server was given, so that a job's first POST
needs no GET /history/{id} before it, while an id another queue ran there is still found.
Each case says when the client must go back to asking the server per job."""

from __future__ import annotations

from typing import Any

import pytest

from comfysup.comfy import ComfyClient, KnownRuns, QueueEntry, ServerUnavailable
from comfysup.comfy import runs as client_module

pytestmark = pytest.mark.timeout(10)


def known(ids: tuple[str, ...] = ("old",)) -> KnownRuns:
    runs = KnownRuns()
    runs.look([QueueEntry(7, "queued", "someone", False)], {i: 5 for i in ids}, 100.0)
    return runs


def test_a_look_then_posts_numbered_in_a_row_stay_known() -> None:
    runs = known()
    assert runs.state == "known" and set(runs.ids) == {"queued", "old"}
    runs.posted("a", 40, 100.0)  # the first post after a look: its number is taken as it comes
    runs.posted("b", 41, 100.0)
    runs.posted("c", 42, 100.0)
    assert runs.state == "known" and {"a", "b", "c"} <= set(runs.ids)


def test_a_number_skipped_is_another_clients_post_and_every_id_is_asked_again() -> None:
    runs = known()
    runs.posted("a", 40, 100.0)
    runs.posted("b", 42, 100.0)
    assert runs.state == "unknown" and not runs.ids


def test_a_refused_post_takes_a_number_too_but_renews_no_trust() -> None:
    runs = known()
    runs.posted("a", 40, 100.0)
    runs.posted("bad", None, 100.5)  # 400: ComfyUI took 41 before it validated
    runs.posted("b", 42, 100.5)
    assert runs.state == "known" and "bad" not in runs.ids and "b" in runs.ids
    # Refusals a second apart prove nothing of other clients' posts: the count is not trusted past a second.
    for t in (101.2, 102.0, 102.8, 103.6):
        runs.posted("bad", None, t)
    assert not runs.trusted(104.0)


def test_a_first_post_long_after_the_look_is_no_start_to_count_from() -> None:
    """Between the look and the first post (a socket to open, inputs to upload) another client may have posted:
    more than a second there and the server is looked at again."""
    runs = known()
    runs.posted("a", 21, 130.0)
    assert runs.state == "unread"
    runs = known()
    runs.posted("a", 21, 100.5)
    assert runs.state == "known" and runs.trusted(101.0)


def test_a_connection_failure_means_looking_again() -> None:
    runs = known()
    runs.posted("a", 40, 100.0)
    runs.forget()
    assert runs.state == "unread" and not runs.trusted(100.0)


def test_numbers_beginning_again_mean_a_restarted_server_to_look_at_again() -> None:
    runs = known()
    runs.posted("a", 40, 100.0)
    runs.posted("b", 1, 100.0)
    assert runs.state == "unread"
    runs.look([], {}, 100.0)
    runs.posted("c", 2, 100.0)
    runs.posted("d", 3, 100.0)
    assert runs.state == "known"


def test_the_count_is_trusted_for_a_second_after_the_look_or_the_last_post() -> None:
    """Another client's post shows only in the number of this client's next one: after a pause (an idle runner,
    a slow prompt) each job is looked up first again, as every job was before."""
    runs = known()
    assert runs.trusted(100.0 + client_module.TRUST_SECONDS)
    assert not runs.trusted(100.0 + client_module.TRUST_SECONDS + 0.01)
    runs.posted("a", 40, 100.5)
    runs.posted("b", 41, 101.4)
    assert runs.trusted(102.0) and not runs.trusted(102.5) and runs.state == "known"


def test_the_ids_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "KNOWN_IDS", 3)
    runs = known(ids=())
    for n in range(10):
        runs.posted(f"p{n}", 40 + n, 100.0)
    assert list(runs.ids) == ["p7", "p8", "p9"] and runs.state == "known"


def test_a_history_too_long_to_read_whole_is_asked_per_job() -> None:
    runs = KnownRuns()
    runs.look([], None, 100.0)
    assert runs.state == "unknown"


class Answers(ComfyClient):
    """A client whose server answers from a table (or fails), counting what it was asked."""

    def __init__(self, history: Any = None, queue: Any = None, down: bool = False) -> None:
        super().__init__("http://127.0.0.1:9")
        self.answers = {"/queue": queue if queue is not None else {"queue_running": [], "queue_pending": []},
                        f"/history?max_items={client_module.LOOK_ENTRIES + 1}": history if history is not None else {}}
        self.down = down
        self.asked: list[str] = []

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        self.asked.append(path)
        if self.down:
            raise ServerUnavailable(f"{method} {path}: refused", "connection")
        return self.answers[path]


def entry(number: int) -> dict[str, Any]:
    return {"prompt": [number, "id", {}, {}, []], "outputs": {}, "status": {}}


def test_may_have_run_looks_once_then_answers_from_what_it_knows() -> None:
    client = Answers(history={"ran-elsewhere": entry(3)},
                     queue={"queue_running": [[4, "running-elsewhere", {}, {}, []]], "queue_pending": []})
    assert client.may_have_run("ran-elsewhere") and client.may_have_run("running-elsewhere")
    assert not client.may_have_run("new")
    assert len(client.asked) == 2  # one look: /queue and /history, not one per id


def test_a_long_history_or_a_malformed_one_is_asked_per_job_and_a_server_down_is_looked_at_later() -> None:
    long = Answers(history={f"p{i}": entry(i) for i in range(client_module.LOOK_ENTRIES + 1)})
    assert long.may_have_run("new") and long.known.state == "unknown"
    malformed = Answers(history={"p": {"prompt": "not a list"}})
    assert malformed.may_have_run("new") and malformed.known.state == "unknown"
    down = Answers(down=True)
    assert down.may_have_run("new") and down.known.state == "unread"
    down.down = False
    assert not down.may_have_run("new") and down.known.state == "known"
