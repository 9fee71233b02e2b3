"""Reading a ComfyUI /history entry: which run it is, how it ended, which files it made (pure functions).

An entry is a server's record of one finished run of a prompt id; ``prompt[0]`` is the number POST /prompt
returned, which tells this run's entry from another run of the same id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from comfysup.comfy.errors import ComfyError, PermanentError, execution_failure

OUTPUT_TYPES = ("output", "temp")
INPUT_TYPE = "input"
"""ComfyUI's third folder: an item of it names a file the prompt was given, not one it made (passed over)."""
LISTING_SAVERS = frozenset({"SaveImage", "SaveAnimatedWEBP", "SaveAnimatedPNG", "SaveAudio", "SaveAudioMP3",
                            "SaveAudioOpus", "SaveVideo", "SaveWEBM"})
"""ComfyUI's own savers, which always list the files they wrote in the history (a cached run too): a
successful entry that lists none for one of them is not a whole answer. Custom savers are not held to it."""


def prompt_number(entry: dict[str, Any]) -> int | None:
    prompt = entry.get("prompt")
    return prompt[0] if isinstance(prompt, list) and prompt else None


def status_of(entry: dict[str, Any]) -> str | None:
    return (entry.get("status") or {}).get("status_str")


def judge(entry: dict[str, Any]) -> dict[str, Any]:
    """A finished run's history entry: returned when it succeeded, else its failure is raised."""
    status = status_of(entry)
    if status == "success":
        return entry
    messages = dict((m[0], m[1]) for m in (entry.get("status") or {}).get("messages") or []
                    if isinstance(m, list) and len(m) == 2)
    if "execution_error" in messages:
        failure = execution_failure(messages["execution_error"])
        raise (ComfyError if failure.transient else PermanentError)(failure.reason, failure.kind)
    if "execution_interrupted" in messages:
        raise ComfyError("execution_interrupted, not asked for by comfysup", "interrupted")
    raise ComfyError(f"ComfyUI reported status {status!r} without an error message", "execution_error")


def unlisted_savers(entry: dict[str, Any], workflow: dict[str, Any]) -> list[str]:
    """``node 3 (SaveImage)`` for each of ComfyUI's savers in ``workflow`` whose files the entry does not
    list: the run is done only when its files are, so such an answer fails the attempt (retried)."""
    outputs = entry.get("outputs") or {}
    missing = []
    for node_id, node in workflow.items():
        if isinstance(node, dict) and node.get("class_type") in LISTING_SAVERS:
            listed = outputs.get(str(node_id)) or {}
            if not any(isinstance(items, list) and items for items in listed.values()):
                missing.append(f"node {node_id} ({node['class_type']})")
    return missing


def output_files(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The files a history entry names: 'output' ones, or the 'temp' previews when there are none. An item of a
    type that is none of ComfyUI's folders (a path, a word of a hostile server) is PermanentError: passing over
    it would end the job done without the file it names."""
    found: dict[str, list[dict[str, Any]]] = {t: [] for t in OUTPUT_TYPES}
    seen: set[tuple[str, str, str]] = set()
    for node_id, item in _file_items(entry):
        kind = item.get("type", "output")
        if kind not in found:
            if kind != INPUT_TYPE:
                raise PermanentError(f"server sent an output item of type {str(kind)[:100]!r} (file "
                                     f"{str(item['filename'])[:100]!r}); an output is of type output or temp",
                                     "unsafe_output")
            continue
        key = (kind, item.get("subfolder") or "", str(item["filename"]))
        if key not in seen:
            seen.add(key)
            found[kind].append({**item, "type": kind, "node": node_id})
    return found["output"] or found["temp"]


def _file_items(entry: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(node id, item)`` of every item of the entry's outputs that names a file; other output kinds (a text,
    a number of a custom node) are passed over."""
    for node_id, node in (entry.get("outputs") or {}).items():
        if not isinstance(node, dict):
            continue
        for items in node.values():
            if isinstance(items, list):
                yield from ((str(node_id), item) for item in items if isinstance(item, dict) and "filename" in item)
