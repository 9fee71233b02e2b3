"""fake_comfy's script: a post deleted from the queue before it ran gives its word back (issue 19: a runner
queues a prompt ahead and may take it back; the word describes what a run meets, not what a post meets)."""

from __future__ import annotations

import json
from pathlib import Path

from fake_comfy.prompt_queue import PromptQueue, QueueItem
from fake_comfy.script import Script


def test_a_word_given_back_goes_to_the_next_post_of_that_id() -> None:
    script = Script(by_id={"a": ["hang", "error"]})
    assert script.take("a") == "hang"
    script.give_back("a")
    assert [script.take("a"), script.take("a"), script.take("a")] == ["hang", "error", "ok"]
    script.give_back("b")  # an id without words: nothing to give back, nothing breaks
    assert script.take("b") == "ok"


def test_a_script_files_count_goes_back_too(tmp_path: Path) -> None:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"a": ["crash", "oom"]}))
    first, second = Script(file=path), Script(file=path)  # two servers sharing one file
    assert first.take("a") == "crash"
    second.give_back("a")
    assert json.loads(Path(f"{path}.used").read_text()) == {"a": 0}
    assert second.take("a") == "crash" and first.take("a") == "oom"
    first.give_back("a")
    first.give_back("a")
    first.give_back("a")  # never below zero
    assert json.loads(Path(f"{path}.used").read_text()) == {"a": 0}


def test_only_a_pending_prompt_that_is_deleted_is_withdrawn() -> None:
    withdrawn: list[str] = []
    queue = PromptQueue(lambda: None, on_withdrawn=lambda item: withdrawn.append(item.prompt_id))
    for number, pid in enumerate(("a", "b", "c")):
        queue.put(QueueItem(number, pid, {}, {}, [], {}))
    running = queue.get()
    assert running is not None and running.prompt_id == "a"
    assert not queue.delete_queue_item("a")  # running: untouched
    assert queue.delete_queue_item("c") and queue.delete_queue_item("b")
    assert withdrawn == ["c", "b"]
