"""The faults the script words cause at a node of a prompt: a crash of the server, a dropped WebSocket, a node
that hangs until interrupted (or ignores the interrupt), an error, an out-of-memory error, a lost device."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .nodework import NodeFailure

if TYPE_CHECKING:
    from .executor import Executor

#: Script words whose fault happens at a node, and the index (in execution order) of that node.
FAULT_AT = {"drop": 0, "crash": 0, "error": 1, "oom": 1, "fatal": 1, "hang": 1, "hostile:run:ignore-interrupt": 1}


async def strike(fault: str | None, node_id: str, ex: Executor, client: str | None, record: dict[str, Any],
                 details: Callable[[str, str], dict[str, Any]]) -> None:
    """The scripted misfortune, at the node the word names (after its executing message)."""
    if fault == "crash":
        ex.recorder.ended(record, "crashed")
        ex.hub.post_action(ex.crash)
        await asyncio.Event().wait()  # the server is going away under us
    elif fault == "drop":
        ex.hub.post_action(lambda: ex.hub.abort(client))
    elif fault == "hang":
        await ex.interrupt_flag.wait()
        raise NodeFailure(node_id)
    elif fault == "hostile:run:ignore-interrupt":  # a custom node that never checks the flag
        await asyncio.Event().wait()
    elif fault == "error":
        raise NodeFailure(node_id, details(node_id, "image_to_mask"))
    elif fault == "oom":
        ex.loaded.clear()  # ComfyUI unloads every model after an out-of-memory error
        raise NodeFailure(node_id, details(node_id, "oom"))
    elif fault == "fatal":
        ex.poisoned = True
        raise NodeFailure(node_id, details(node_id, "device_lost"))
