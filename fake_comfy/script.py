"""The script: which misfortune each posted prompt meets.

Two sources, both optional. Words by id (set in-process or in a JSON file) give one word per time an
id is posted (a post deleted from the queue before it ran gives its word back to the next one), so a
test's outcome does not depend on which job arrives first, nor on a client that queues ahead; words in arrival order
cover the prompts whose id has no entry. Past the end of a list a prompt is "ok".

The file's consumption is kept beside it (`<file>.used`, under an flock), so several fake servers
launched by one supervisor, and a fake restarted after a scripted crash, share one count: a job
scripted ["crash", "ok"] crashes once, wherever it lands, and then succeeds.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from .hostile import mutation_of

try:
    import fcntl
except ImportError:  # pragma: no cover - not Unix: the lock below is then a no-op
    fcntl = None  # type: ignore[assignment]

#: The words and what they do; README-style summary for --help and errors.
WORDS: dict[str, str] = {
    "ok": "runs every node, then execution_success",
    "500": "answers POST /prompt with aiohttp's plain-text 500",
    "invalid": "answers POST /prompt with 400 prompt_outputs_failed_validation and node_errors",
    "error": "execution_error at the second node (the recorded IndexError)",
    "oom": "execution_error at the second node with a CUDA out-of-memory error",
    "fatal": "execution_error at the second node with a CUDA device-side assert; every later prompt fails the "
             "same way until the server restarts",
    "drop": "aborts the client's WebSocket at the first node, then finishes the prompt",
    "hang": "stops at the second node until POST /interrupt",
    "slow": "like ok, ten times slower",
    "crash": "the whole server dies at the first node",
    "hostile": "history and executed name output files with ../ and absolute paths",
    "hostile:NAME": "the prompt faces the mutation NAME of fake_comfy.hostile.CATALOGUE",
}


class ScriptError(ValueError):
    """A script names a word the fake does not know."""


def check_words(words: Sequence[str]) -> list[str]:
    """The words as a list, or ScriptError naming the first unknown one."""
    if not isinstance(words, list | tuple):
        raise ScriptError(f"a script is a list of words, not {words!r}")
    for word in words:
        if (word not in WORDS and mutation_of(word) is None) or word == "hostile:NAME":
            raise ScriptError(f"unknown script word {word!r}; known: {', '.join(WORDS)}")
    return list(words)


def parse_words(text: str) -> list[str]:
    """--script WORD,WORD,... as a list (empty items are skipped)."""
    return check_words([w.strip() for w in text.split(",") if w.strip()])


def load_script_file(path: Path) -> dict[str, list[str]]:
    """A script file: a JSON object from prompt id to a list of words."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, dict):
        raise ScriptError(f"{path}: a script file holds a JSON object from prompt id to a list of words")
    return {str(pid): check_words(words) for pid, words in data.items()}


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock shared by every process using one script file (no-op where flock is absent)."""
    if fcntl is None:  # pragma: no cover - not Unix
        yield
        return
    with open(f"{path}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class Script:
    """Thread-safe word source; `take(prompt_id)` is called once per POST /prompt that has a prompt, and
    `give_back(prompt_id)` when that post is deleted from the queue before it ran."""

    def __init__(
        self,
        words: Sequence[str] = (),
        by_id: Mapping[str, Sequence[str]] | None = None,
        file: Path | str | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._order: list[str] = check_words(words)
        self._position = 0
        self._by_id: dict[str, list[str]] = {}
        self._used: dict[str, int] = {}
        self._file: Path | None = None
        if by_id:
            self.set_by_id(by_id)
        if file is not None:
            self.set_file(file)

    def set_order(self, words: Sequence[str]) -> None:
        """Replace the arrival-order words and start again from the first."""
        checked = check_words(words)
        with self._lock:
            self._order, self._position = checked, 0

    def set_by_id(self, mapping: Mapping[str, Sequence[str]]) -> None:
        """Replace the in-process words by id; counting starts again for every id."""
        checked = {str(pid): check_words(words) for pid, words in mapping.items()}
        with self._lock:
            self._by_id, self._used = checked, {}

    def set_file(self, path: Path | str | None) -> None:
        """Use a script file (read on every post, so a test may rewrite it while the server runs)."""
        if path is not None:
            load_script_file(Path(path))  # fail early on a bad file
        with self._lock:
            self._file = Path(path) if path is not None else None

    def take(self, prompt_id: str) -> str:
        """The word for this post of `prompt_id`, consuming it."""
        with self._lock:
            if self._file is not None:
                word = self._take_from_file(self._file, prompt_id)
                if word is not None:
                    return word
            if prompt_id in self._by_id:
                used = self._used.get(prompt_id, 0)
                self._used[prompt_id] = used + 1
                words = self._by_id[prompt_id]
                return words[used] if used < len(words) else "ok"
            if self._position < len(self._order):
                self._position += 1
                return self._order[self._position - 1]
            return "ok"

    def give_back(self, prompt_id: str) -> None:
        """A post of ``prompt_id`` was deleted from the queue before it ran: its word goes to the next post of
        that id (a word describes what a run meets; a client that queues a prompt ahead and takes it back
        did not run it). Words by id only: an arrival-order word stays used."""
        with self._lock:
            if self._file is not None and self._count_in_file(self._file, prompt_id, -1) is not None:
                return
            if self._used.get(prompt_id, 0) > 0:
                self._used[prompt_id] -= 1

    @staticmethod
    def _take_from_file(path: Path, prompt_id: str) -> str | None:
        words_and_count = Script._count_in_file(path, prompt_id, +1)
        if words_and_count is None:
            return None
        words, count = words_and_count
        return words[count] if count < len(words) else "ok"

    @staticmethod
    def _count_in_file(path: Path, prompt_id: str, step: int) -> tuple[list[str], int] | None:
        """Move ``prompt_id``'s count in ``<file>.used`` by ``step`` (never below 0); its words and the count
        before the move, or None when the file has no words for it."""
        with _file_lock(path):
            try:
                words = load_script_file(path).get(prompt_id)
            except (OSError, ValueError) as exc:
                print(f"fake_comfy: ignoring script file {path}: {exc}", file=sys.stderr, flush=True)
                return None
            if words is None:
                return None
            used_path = Path(f"{path}.used")
            try:
                used = json.loads(used_path.read_text())
            except (OSError, ValueError):
                used = {}
            count = int(used.get(prompt_id, 0))
            used[prompt_id] = max(0, count + step)
            tmp = used_path.with_name(used_path.name + f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(used))
            os.replace(tmp, used_path)
            return words, count
