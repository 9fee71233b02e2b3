"""Runs one prompt the way ComfyUI 0.3.64's PromptExecutor does, in the recorded message order.

Per prompt: execution_start, execution_cached, then per node progress_state(running), executing,
[the node's work], executed (output nodes), progress_state(finished); then execution_success, or
execution_error / execution_interrupted. Who hears what follows ComfyUI's add_message: events go to the
prompt's client only; with no client id, execution_interrupted and progress_state go to everyone and
execution_start/cached/error/success, executing and executed to no one.

The output cache is ComfyUI's classic cache: a node whose inputs (recursively) are unchanged since the
previous prompt is not run again; an output node served from the cache replays `executed` with its
old file names and writes nothing.
"""

from __future__ import annotations

import asyncio
import random
import string
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import nodework, t2i
from .faults import FAULT_AT, strike
from .graph import post_order, signatures
from .images import jpeg_bytes
from .nodes import is_link, is_loader, model_name
from .nodework import Model, NodeFailure
from .pacing import Pace, RunClock

if TYPE_CHECKING:
    from .hub import Hub
    from .options import Options
    from .prompt_queue import QueueItem
    from .stats import Recorder

#: Words that may use the output cache (a fault must not be hidden by a cache hit).
CACHE_WORDS = ("ok", "slow")


@dataclass
class CacheEntry:
    value: Any
    ui: dict[str, Any] | None


@dataclass
class Outcome:
    """How a run ended, what its history entry holds (result and status) and its stats record."""

    outcome: str
    result: dict[str, Any]
    status: dict[str, Any]
    record: dict[str, Any]
    nominal_end: float | None = None
    """The loop's clock at execution_start + the node time given: when the prompt should end."""


def now_ms() -> int:
    return int(time.time() * 1000)


class Executor:
    """Server-lifetime execution state: client id, last node, interrupt flag, cache, loaded models."""

    def __init__(self, options: Options, hub: Hub, recorder: Recorder, crash: Callable[[], None]) -> None:
        self.options = options
        self.hub = hub
        self.recorder = recorder
        self.crash = crash
        self.client_id: str | None = None
        self.last_node_id: str | None = None
        self.interrupt_flag = asyncio.Event()
        self.pace = Pace()
        self.cache: dict[str, CacheEntry] = {}
        self.loaded: dict[str, str | None] = {}
        self.poisoned = False
        """A "fatal" word ran: CUDA's context is gone, every later node fails the same way until a restart."""
        self.preview_prefix = "_temp_" + "".join(random.choice(string.ascii_lowercase) for _ in range(5))

    def interrupt(self) -> None:
        """nodes.interrupt_processing(): the running prompt stops at its next check."""
        self.interrupt_flag.set()

    def free(self, unload_models: bool, free_memory: bool) -> None:
        """What the worker does with POST /free's flags: forget loaded models, drop the output cache."""
        if unload_models:
            self.loaded.clear()
        if free_memory:
            self.cache.clear()

    async def execute(self, item: QueueItem) -> Outcome:
        """Run a prompt to its end (success, error or interrupted)."""
        return await _Run(self, item).go()

    def ended(self, outcome: Outcome) -> None:
        """The prompt's end has been sent (history written, executing None): a prompt that succeeded teaches the
        pace how long its end takes past its node time (fake_comfy.pacing)."""
        if outcome.outcome == "success" and outcome.nominal_end is not None:
            self.pace.ended(outcome.nominal_end)


class _Run:
    """One execution of one queue item (what each node computes is nodework's; this is the order, the time and
    the messages)."""

    def __init__(self, executor: Executor, item: QueueItem) -> None:
        self.ex = executor
        self.item = item
        self.pid = item.prompt_id
        self.prompt = item.prompt
        self.extra_data = item.extra_data
        self.word = item.word
        self.options = executor.options
        self.preview_prefix = executor.preview_prefix
        self.client = item.client_id
        self.progress: dict[str, dict[str, Any]] = {}
        self.executed: list[str] = []
        self.values: dict[str, Any] = {}
        self.ui: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.status_messages: list[list[Any]] = []
        self.slow = 10.0 if item.word == "slow" else 1.0
        self.sigs: dict[str, str] = {}
        self.clock = RunClock(executor.pace, executor.interrupt_flag)

    # -- messages -------------------------------------------------------------------------------

    def message(self, event: str, payload: dict[str, Any], broadcast: bool) -> None:
        """PromptExecutor.add_message: timestamped, kept for the history, sent by the rules above."""
        payload = {**payload, "timestamp": now_ms()}
        self.status_messages.append([event, payload])
        if self.client is not None or broadcast:
            self.ex.hub.post(event, payload, self.client)

    def to_client(self, event: str, payload: dict[str, Any]) -> None:
        if self.client is not None:
            self.ex.hub.post(event, payload, self.client)

    def progress_state(self, node_id: str, value: float, maximum: float, state: str) -> None:
        self.progress[node_id] = {
            "value": value,
            "max": maximum,
            "state": state,
            "node_id": node_id,
            "prompt_id": self.pid,
            "display_node_id": node_id,
            "parent_node_id": None,
            "real_node_id": node_id,
        }
        nodes = {k: dict(v) for k, v in self.progress.items()}
        self.ex.hub.post("progress_state", {"prompt_id": self.pid, "nodes": nodes}, self.client)

    # -- the run --------------------------------------------------------------------------------

    async def go(self) -> Outcome:
        ex = self.ex
        ex.interrupt_flag.clear()
        ex.client_id = self.client
        stages, cached = self.plan()
        record = ex.recorder.started(
            self.pid, self.item.number, self.item.word, all(n in cached for n in stages)
        )
        self.message("execution_start", {"prompt_id": self.pid}, broadcast=False)
        self.clock.start()
        self.message(
            "execution_cached",
            {"nodes": [n for n in self.prompt if n in cached], "prompt_id": self.pid},
            broadcast=False,
        )
        try:
            outcome = await self.run_stages(stages, cached, record)
        except asyncio.CancelledError:
            ex.recorder.ended(record, "stopped")
            raise
        ex.last_node_id = None
        status = {
            "status_str": "success" if outcome == "success" else "error",
            "completed": outcome == "success",
            "messages": self.status_messages,
        }
        return Outcome(outcome, {"outputs": self.ui, "meta": self.meta}, status, record, self.clock.nominal_end())

    def plan(self) -> tuple[list[str], set[str]]:
        """The nodes to run in order (an output node served from the cache stays, to replay it) and the cached
        ones; the cache keeps only what this prompt may use."""
        ex = self.ex
        self.sigs = sigs = signatures(self.prompt)
        wanted = set(sigs.values())
        ex.cache = {k: v for k, v in ex.cache.items() if k in wanted}
        use_cache = self.item.word in CACHE_WORDS
        cached = {n for n in self.prompt if use_cache and sigs[n] in ex.cache}
        stages = post_order(self.prompt, self.item.outputs, lambda n: n not in cached)
        stages = [n for n in stages if n not in cached or n in self.item.outputs]
        self.clock.last_node = next((n for n in reversed(stages) if n not in cached), None)
        return stages, cached

    async def run_stages(self, stages: list[str], cached: set[str], record: dict[str, Any]) -> str:
        """Every staged node in order; the outcome is success, error or interrupted."""
        fault_index = min(FAULT_AT.get(self.item.word, -1), len(stages) - 1)
        try:
            for index, node_id in enumerate(stages):
                if node_id in cached:
                    self.replay(node_id, self.ex.cache[self.sigs[node_id]])
                else:
                    fault = self.item.word if index == fault_index else None
                    await self.run_node(node_id, self.sigs[node_id], fault, record)
        except NodeFailure as failure:
            self.report(failure)
            return "interrupted" if failure.interrupted else "error"
        self.message("execution_success", {"prompt_id": self.pid}, broadcast=False)
        return "success"

    def replay(self, node_id: str, entry: CacheEntry) -> None:
        """An output node served from the cache: executed with the old output, no executing, no file."""
        self.to_client(
            "executed",
            {
                "node": node_id,
                "display_node": node_id,
                "output": entry.ui["output"] if entry.ui else None,
                "prompt_id": self.pid,
            },
        )
        self.progress_state(node_id, 1, 1, "finished")  # ComfyUI counts a replay in integers (a run in floats)
        self.values[node_id] = entry.value
        if entry.ui:
            self.ui[node_id] = entry.ui["output"]
            self.meta[node_id] = entry.ui["meta"]

    async def run_node(self, node_id: str, sig: str, fault: str | None, record: dict[str, Any]) -> None:
        class_type = self.prompt[node_id]["class_type"]
        self.progress_state(node_id, 0.0, 1.0, "running")
        if self.client is not None:
            self.ex.last_node_id = node_id
            self.to_client("executing", {"node": node_id, "display_node": node_id, "prompt_id": self.pid})
        await strike("fatal" if self.ex.poisoned else fault, node_id, self.ex, self.client, record,
                     self.error_details)
        try:
            value, output = await self.compute(node_id, class_type)
        except NodeFailure:
            raise
        except Exception as exc:  # whatever a node raises fails its prompt, as in ComfyUI; the worker goes on
            raise NodeFailure(node_id, nodework.exception_details(exc, self.current_inputs(node_id))) from None
        if output:
            ui = {
                "meta": {
                    "node_id": node_id,
                    "display_node": node_id,
                    "parent_node": None,
                    "real_node_id": node_id,
                },
                "output": output,
            }
            self.ui[node_id], self.meta[node_id] = output, ui["meta"]
            self.to_client(
                "executed",
                {"node": node_id, "display_node": node_id, "output": output, "prompt_id": self.pid},
            )
        else:
            ui = None
        self.progress_state(node_id, 1.0, 1.0, "finished")
        self.executed.append(node_id)
        self.values[node_id] = value
        self.ex.cache[sig] = CacheEntry(value, ui)

    async def work(self, node_id: str, ms: float) -> None:
        """A node's time (fake_comfy.pacing); an interrupt, set before or during it, stops the prompt here."""
        await self.clock.work(node_id, ms)

    def report(self, failure: NodeFailure) -> None:
        """PromptExecutor.handle_execution_error."""
        base = {
            "prompt_id": self.pid,
            "node_id": failure.node_id,
            "node_type": self.prompt[failure.node_id]["class_type"],
            "executed": list(self.executed),
        }
        if failure.details is None:
            self.message("execution_interrupted", base, broadcast=True)
        else:
            self.message(
                "execution_error",
                {**base, **failure.details, "current_outputs": list(self.prompt)},
                broadcast=False,
            )

    def error_details(self, node_id: str, kind: str, message: str | None = None) -> dict[str, Any]:
        """exception_message/type, traceback and current_inputs, from the recorded error `kind`."""
        return nodework.recorded_error(kind, message, self.current_inputs(node_id))

    def current_inputs(self, node_id: str) -> dict[str, list[Any]]:
        return nodework.current_inputs(self.prompt[node_id].get("inputs", {}), self.input_value)

    def input_value(self, link: list[Any]) -> Any:
        source = link[0]
        if source in self.values:
            value = self.values[source]
        else:
            entry = self.ex.cache.get(self.sigs[source])
            value = entry.value if entry else None
        if isinstance(value, t2i.Outputs):  # a node of several outputs: the one linked
            return value.values[link[1]] if 0 <= link[1] < len(value.values) else None
        return value

    def inputs(self, node_id: str) -> dict[str, Any]:
        """The node's inputs with links replaced by the values their sources produced."""
        resolved = {}
        for name, value in self.prompt[node_id].get("inputs", {}).items():
            resolved[name] = self.input_value(value) if is_link(value) and value[0] in self.prompt else value
        return resolved

    # -- what each node does ------------------------------------------------------------------

    async def compute(self, node_id: str, class_type: str) -> tuple[Any, dict[str, Any] | None]:
        """The node's value and UI output, after its time (node_ms; loaders add load_ms on a swap)."""
        inputs = self.inputs(node_id)
        row = t2i.behaviour(class_type, inputs)
        if row is not None:
            if self.ex.interrupt_flag.is_set():
                raise NodeFailure(node_id)  # before a node that writes files, as for SaveImage
            return await row(node_id, inputs, self)
        if class_type == "ComfysupProgressDemo":
            await self.progress_demo(node_id, inputs)
            return inputs.get("image"), None
        if class_type in ("SaveImage", "PreviewImage"):
            # The file is written within the node's time, not after it, as a real node's own work is part of
            # the time it takes: a prompt of T ms ends T ms after its start, its PNG included (a 64x64 PNG, its
            # folder's scan for the next counter and its write: about 1 ms here, which came on top of T before).
            if self.ex.interrupt_flag.is_set():
                raise NodeFailure(node_id)  # checked before each node, as ComfyUI does: no file then
            images = nodework.save(node_id, inputs, "output" if class_type == "SaveImage" else "temp", self)
            await self.node_time(node_id)
            return None, {"images": images}
        await self.node_time(node_id)
        if is_loader(class_type):
            return await self.load(node_id, class_type, inputs), None
        return nodework.transform(node_id, class_type, inputs, self), None

    async def load(self, node_id: str, class_type: str, inputs: dict[str, Any]) -> Model:
        """A pass-through loader; a model name other than the one this class loaded last costs load_ms."""
        name = model_name(inputs)
        if class_type not in self.ex.loaded or self.ex.loaded[class_type] != name:
            self.ex.loaded[class_type] = name
            self.ex.recorder.event(
                "model_loads", prompt_id=self.pid, node_id=node_id, class_type=class_type, model=name
            )
            await self.work(node_id, self.ex.options.load_ms * self.slow)
        return Model(class_type, name)

    async def node_time(self, node_id: str) -> None:
        """A node's own time: --node-ms (ten times that for the "slow" word)."""
        await self.work(node_id, self.ex.options.node_ms * self.slow)

    async def step(self, node_id: str, step: int, steps: int, step_ms: float | None = None,
                   preview: bytes | None = None) -> None:
        """One step of a node that reports progress (a sampler's, --step-ms each): its time, then progress_state,
        the preview if any, and the `progress` message (the preview after it for a client without metadata)."""
        await self.work(node_id, (self.ex.options.step_ms if step_ms is None else step_ms) * self.slow)
        self.progress_state(node_id, float(step), float(steps), "running")
        with_metadata = self.ex.hub.supports(self.client, "supports_preview_metadata")
        if preview is not None and with_metadata:
            metadata = {"node_id": node_id, "prompt_id": self.pid, "display_node_id": node_id,
                        "parent_node_id": None, "real_node_id": node_id, "image_type": "image/jpeg"}
            self.ex.hub.post_preview(preview, metadata, self.client)
        self.ex.hub.post("progress", {"value": step, "max": steps, "prompt_id": self.pid, "node": node_id},
                         self.client)
        if preview is not None and not with_metadata:
            self.ex.hub.post_preview(preview, None, self.client)

    async def progress_demo(self, node_id: str, inputs: dict[str, Any]) -> None:
        """The recorded test-only custom node: N progress steps, each with a 16x16 JPEG preview."""
        steps, step_seconds = int(inputs.get("steps", 3)), float(inputs.get("step_seconds", 0.1))
        preview = jpeg_bytes(16, 16, (255, 0, 0))
        for step in range(1, steps + 1):
            await self.step(node_id, step, steps, step_seconds * 1000, preview)
