"""What the fake received and did, per prompt id, for tests to assert on ("posted twice, executed once").

Kept outside the server so that it survives an in-process crash and restart: a test that kills the
fake mid-prompt still sees that the prompt was executed once before the crash. Times are UTC epoch
seconds (`time.time()`).
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time
from pathlib import Path
from typing import Any


def _prompt_record() -> dict[str, Any]:
    return {"posted": 0, "executed": 0, "cached": 0, "posts": [], "executions": []}


class Recorder:
    """Thread-safe log; `snapshot()` is the JSON served at GET /fake/stats.

    Shape::

        {"prompts": {id: {"posted": n, "executed": n, "cached": n,
                          "posts": [{"at", "number", "word", "status"}],
                          "executions": [{"number", "word", "cached", "started_at", "ended_at", "outcome"}],
                          "hostile": {"mutation", "where", "source", "hits", "last_hit"}}},  # hostile only
         "order": [id, ...],                      # execution starts, in order
         "interrupts": [{"at", "prompt_id", "running", "effective"}],
         "queue_deletes": [{"at", "prompt_id", "removed"}], "queue_clears": [{"at", "removed": [id]}],
         "frees": [{"at", "unload_models", "free_memory"}],
         "model_loads": [{"at", "prompt_id", "node_id", "class_type", "model"}],
         "views": [{"at", "filename", "subfolder", "type", "status"}],  # every GET /view with a filename
         "servers": [{"started_at", "port", "ended_at", "crashed"}], "busy": [id, ...]}

    `executed` counts every execution start, including runs served entirely from the cache (those
    also count in `cached`); outcome is success, error, interrupted, crashed (the server died under it)
    or stopped (the in-process server was stopped under it); None while running.

    With ``exec_log`` (``--exec-log FILE``) every server start, answered post, execution start and
    execution end is also appended to that file as one JSON line, with this process's pid and port.
    The stats above die with the process, so a test that kills and restarts servers (the chaos suite)
    reads this file instead: it outlives every server, and several servers can share it (each line is
    one ``write`` to a file opened with O_APPEND, so lines of two processes never interleave). An
    execution whose server was killed has a start line and no end line.
    """

    def __init__(self, exec_log: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._exec_log = exec_log
        self._port: int | None = None
        self._ids: dict[int, str] = {}
        """The prompt id of each post and run record (by object id; the records live as long as this), for
        the log lines of ``answered`` and ``ended``, without adding a key to the records /fake/stats shows."""
        self._data: dict[str, Any] = {
            "prompts": {},
            "order": [],
            "interrupts": [],
            "queue_deletes": [],
            "queue_clears": [],
            "frees": [],
            "model_loads": [],
            "views": [],
            "servers": [],
            "busy": [],
        }

    def _log(self, event: str, **fields: Any) -> None:
        """One line in the execution log, if there is one (called with the lock held)."""
        if self._exec_log is None:
            return
        line = json.dumps({"event": event, "at": time.time(), "pid": os.getpid(), "port": self._port, **fields})
        fd = os.open(self._exec_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)

    def _prompt(self, prompt_id: str) -> dict[str, Any]:
        return self._data["prompts"].setdefault(prompt_id, _prompt_record())

    def posted(self, prompt_id: str, word: str) -> dict[str, Any]:
        """Count a POST /prompt for this id; the returned post is completed by `answered`."""
        with self._lock:
            record = self._prompt(prompt_id)
            record["posted"] += 1
            post = {"at": time.time(), "number": None, "word": word, "status": None}
            self._ids[id(post)] = prompt_id
            record["posts"].append(post)
            return post

    def answered(self, post: dict[str, Any], status: int, number: float | None) -> None:
        with self._lock:
            post["status"], post["number"] = status, number
            self._log("post", prompt_id=self._ids.get(id(post)), number=number, word=post["word"], status=status)

    def busy(self, prompt_id: str, number: float) -> None:
        """A prompt the fake queued itself (--busy)."""
        with self._lock:
            record = self._prompt(prompt_id)
            record["posted"] += 1
            record["posts"].append({"at": time.time(), "number": number, "word": "hang", "status": 200})
            self._data["busy"].append(prompt_id)

    def started(self, prompt_id: str, number: float, word: str, cached: bool) -> dict[str, Any]:
        """An execution began (execution_start); finish it with `ended`."""
        with self._lock:
            record = self._prompt(prompt_id)
            record["executed"] += 1
            record["cached"] += int(cached)
            run = {
                "number": number,
                "word": word,
                "cached": cached,
                "started_at": time.time(),
                "ended_at": None,
                "outcome": None,
            }
            record["executions"].append(run)
            self._data["order"].append(prompt_id)
            self._ids[id(run)] = prompt_id
            self._log("start", prompt_id=prompt_id, number=number, word=word, cached=cached,
                      started_at=run["started_at"])
            return run

    def ended(self, run: dict[str, Any], outcome: str) -> None:
        """Set the outcome of an execution that has none yet (a crash is recorded before the end)."""
        with self._lock:
            if run["outcome"] is None:
                run["ended_at"], run["outcome"] = time.time(), outcome
                self._log("end", prompt_id=self._ids.get(id(run)), number=run["number"], word=run["word"],
                          started_at=run["started_at"], ended_at=run["ended_at"], outcome=outcome)

    def completed(self, run: dict[str, Any]) -> None:
        """Every node of an execution ran (its files are written); its history is written after this."""
        with self._lock:
            self._log("completed", prompt_id=self._ids.get(id(run)), number=run["number"], word=run["word"],
                      completed_at=time.time())

    def hostile(self, prompt_id: str, mutation: str, where: str, source: str) -> None:
        """A post gave this prompt a mutation (source: script or seed); `hits` counts mangled answers."""
        with self._lock:
            self._prompt(prompt_id)["hostile"] = {
                "mutation": mutation, "where": where, "source": source, "hits": 0, "last_hit": None
            }

    def hostile_hit(self, prompt_id: str, answer: str) -> None:
        with self._lock:
            record = self._prompt(prompt_id).get("hostile")
            if record is not None:
                record["hits"] += 1
                record["last_hit"] = {"at": time.time(), "answer": answer}

    def event(self, kind: str, **fields: Any) -> None:
        """Append to one of the plain lists (interrupts, queue_deletes, queue_clears, frees, model_loads, views)."""
        with self._lock:
            self._data[kind].append({"at": time.time(), **fields})

    def server_started(self, port: int) -> dict[str, Any]:
        with self._lock:
            entry = {"started_at": time.time(), "port": port, "ended_at": None, "crashed": False}
            self._data["servers"].append(entry)
            self._port = port
            self._log("server", started_at=entry["started_at"])
            return entry

    def server_ended(self, entry: dict[str, Any], crashed: bool) -> None:
        with self._lock:
            entry["ended_at"], entry["crashed"] = time.time(), crashed

    def snapshot(self) -> dict[str, Any]:
        """A deep copy, safe to keep and compare while the server goes on."""
        with self._lock:
            return copy.deepcopy(self._data)
