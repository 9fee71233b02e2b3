"""ComfyUI's PromptQueue: a heap of pending prompts, the running one, and the bounded history.

Pure state, no I/O: the server calls `on_change` (ComfyUI's queue_updated, which broadcasts a status
message) wherever the original does, so the number and order of status messages match.
"""

from __future__ import annotations

import copy
import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .options import MAXIMUM_HISTORY_SIZE

#: extra_data keys ComfyUI moves out of the queue entry and never writes to the history.
SENSITIVE_EXTRA_DATA_KEYS = ("auth_token_comfy_org", "api_key_comfy_org")

_sequence = itertools.count()


@dataclass
class QueueItem:
    """One queued prompt: ComfyUI's (number, prompt_id, prompt, extra_data, outputs, sensitive) + the word."""

    number: float
    prompt_id: str
    prompt: dict[str, Any]
    extra_data: dict[str, Any]
    outputs: list[str]
    sensitive: dict[str, Any] = field(default_factory=dict)
    word: str = "ok"
    seq: int = field(default_factory=lambda: next(_sequence))

    def __lt__(self, other: QueueItem) -> bool:
        # ComfyUI compares the tuples; (number, prompt_id) decide except on exact ties.
        return (self.number, self.prompt_id, self.seq) < (other.number, other.prompt_id, other.seq)

    def public(self) -> list[Any]:
        """The five-element entry GET /queue and the history show (sensitive data removed)."""
        return [self.number, self.prompt_id, self.prompt, self.extra_data, self.outputs]

    @property
    def client_id(self) -> str | None:
        return self.extra_data.get("client_id") if "client_id" in self.extra_data else None


class PromptQueue:
    """Pending heap, running item, history; `on_change` fires where ComfyUI calls queue_updated."""

    def __init__(self, on_change: Callable[[], None], max_history: int = MAXIMUM_HISTORY_SIZE,
                 on_withdrawn: Callable[[QueueItem], None] = lambda item: None) -> None:
        self.on_change = on_change
        self.on_withdrawn = on_withdrawn
        """Not ComfyUI: told of a pending prompt deleted before it ran (the script gives its word back)."""
        self.max_history = max_history
        self.pending: list[QueueItem] = []
        self.running: dict[int, QueueItem] = {}
        self.history: dict[str, dict[str, Any]] = {}

    def put(self, item: QueueItem) -> None:
        heapq.heappush(self.pending, item)
        self.on_change()

    def get(self) -> QueueItem | None:
        """Start the next prompt (lowest number), or None when nothing is pending."""
        if not self.pending:
            return None
        item = heapq.heappop(self.pending)
        self.running[item.seq] = item
        self.on_change()
        return item

    def task_done(self, item: QueueItem, result: dict[str, Any], status: dict[str, Any]) -> None:
        """Finish the running prompt and write its history entry (replacing one with the same id in place)."""
        self.running.pop(item.seq, None)
        if len(self.history) > self.max_history:
            self.history.pop(next(iter(self.history)))
        for key in SENSITIVE_EXTRA_DATA_KEYS:
            item.extra_data.pop(key, None)
        entry = {"prompt": item.public(), "outputs": {}, "status": copy.deepcopy(status)}
        entry.update(result)
        self.history[item.prompt_id] = entry
        self.on_change()

    def forget_running(self, item: QueueItem) -> None:
        """Drop a running prompt without history (the server died under it)."""
        self.running.pop(item.seq, None)

    def remaining(self) -> int:
        """status.exec_info.queue_remaining: pending plus running."""
        return len(self.pending) + len(self.running)

    def queue_info(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": self.remaining()}}

    def running_ids(self) -> list[str]:
        return [item.prompt_id for item in self.running.values()]

    def wipe_queue(self) -> list[str]:
        """POST /queue {clear}: pending only; the running prompt goes on."""
        removed = [item.prompt_id for item in self.pending]
        self.pending = []
        self.on_change()
        return removed

    def delete_queue_item(self, prompt_id: Any) -> bool:
        """POST /queue {delete}: the first pending entry with this id (a running one is untouched)."""
        for index, item in enumerate(self.pending):
            if item.prompt_id == prompt_id:
                if len(self.pending) == 1:
                    self.wipe_queue()
                else:
                    self.pending.pop(index)
                    heapq.heapify(self.pending)
                self.on_withdrawn(item)
                self.on_change()
                return True
        return False

    def get_history(
        self, prompt_id: str | None = None, max_items: int | None = None, offset: int = -1
    ) -> dict:
        """GET /history and /history/{id}, with ComfyUI's max_items/offset arithmetic."""
        if prompt_id is not None:
            if prompt_id in self.history:
                return {prompt_id: copy.deepcopy(self.history[prompt_id])}
            return {}
        out: dict[str, Any] = {}
        if offset < 0 and max_items is not None:
            offset = len(self.history) - max_items
        for i, key in enumerate(self.history):
            if i >= offset:
                out[key] = self.history[key]
                if max_items is not None and len(out) >= max_items:
                    break
        return out

    def wipe_history(self) -> None:
        self.history = {}

    def delete_history_item(self, prompt_id: Any) -> None:
        self.history.pop(prompt_id, None)
