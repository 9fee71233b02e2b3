"""What ComfyUI 0.38 answers differently from 0.3.64, for `--comfyui-version 0.38` (the default).

Every difference was read from ComfyUI's own source (the commits are in fake_comfy/README.md and
docs/comfyui-versions.md); in 0.3.64 mode nothing here runs and every answer stays the recorded one.
The server keeps one `Version` and asks it at a few hooks (routes, POST /prompt's id, validation,
/system_stats, /features, /view, WebSocket messages, history entries, the cache, start-up).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from .validate import validate_prompt
from .version import NEW, OLD

if TYPE_CHECKING:
    from .nodes import Catalogue
    from .options import Options
    from .server import FakeServer

VERSION_STRINGS = {OLD: "0.3.64", NEW: "0.38.1"}
"""What /system_stats reports as comfyui_version (comfyui_version.py of each)."""
REMOVED_FLAGS = ("--normalvram", "--disable-ipex-optimize")
"""Flags of 0.3.64 that 0.38's comfy/cli_args.py no longer defines: argparse exits 2 on them."""
LOCK_WAIT_SECONDS = 5.0
"""app/database/db.py _LOCK_WAIT_SECONDS: a relaunch may start while the previous process still exits."""
DANGEROUS_TYPES = {"text/html", "text/html-sandboxed", "application/xhtml+xml", "text/javascript",
                   "text/css", "image/svg+xml", "application/xml", "text/xml", "application/javascript"}
"""Types /view sends as attachments (folder_paths.is_dangerous_content_type: what can carry a script)."""
JOB_STATUSES = ("pending", "in_progress", "completed", "failed", "cancelled")


def removed_flag(argv: list[str]) -> str | None:
    """The first flag 0.38 no longer has (its argparse would exit 2 naming it), or None."""
    for arg in argv:
        if arg.split("=", 1)[0] in REMOVED_FLAGS:
            return arg.split("=", 1)[0]
    return None


def valid_job_id(value: Any) -> bool:
    """comfy_execution/jobs.py validate_job_id: a str in canonical lowercase hyphenated UUID form."""
    if not isinstance(value, str):
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def port_in_use_message(port: int, address: str) -> str:
    """server.py start_multi_address on EADDRINUSE (then SystemExit(1))."""
    return (f"Port {port} is already in use on address {address}. Please close the other application or use a "
            "different port with --port.")


# -- assets: one process per database ---------------------------------------------------------------------


class AssetsInUse(RuntimeError):
    """Another process holds the assets database's lock: ComfyUI 0.38 prints this and exits 1."""


def database_path(options: Options) -> Path | None:
    """The assets database: --database-url's sqlite file, else <user directory>/comfyui.db; None when the
    assets are off or the database is in memory."""
    if options.comfyui_version != NEW or options.disable_assets:
        return None
    url = options.database_url
    if url is None:
        return Path(options.base_directory).absolute() / "user" / "comfyui.db"
    if url in ("sqlite://", "sqlite:///:memory:") or not url.startswith("sqlite:///"):
        return None
    return Path(unquote(urlsplit(url).path))


class AssetsLock:
    """The `<db>.lock` file lock that app/database/db.py takes with filelock (flock on Linux), held while
    the server runs; released when the process dies, so a killed server never blocks its restart."""

    def __init__(self, path: Path | None, wait_seconds: float = LOCK_WAIT_SECONDS) -> None:
        self.path, self.wait_seconds, self._fd = path, wait_seconds, None

    def acquire(self) -> None:
        if self.path is None or self._fd is not None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{self.path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        until = time.monotonic() + self.wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= until:
                    os.close(fd)
                    raise AssetsInUse(in_use_message(self.path)) from None
                time.sleep(0.05)
        self._fd = fd
        if not self.path.exists():
            self.path.touch()

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
                os.close(self._fd)
            self._fd = None


def in_use_message(path: Path) -> str:
    return (f"ASSETS_STARTUP_FAILED: in_use\nAnother ComfyUI is already using this database: '{path}'.\n"
            "Close the other ComfyUI and start this one again.\n"
            "Or give this ComfyUI its own database: --database-url sqlite:///path/to/another.db\n"
            "Or start ComfyUI without the assets system: --disable-assets")


# -- validation -------------------------------------------------------------------------------------------


def _error(kind: str, message: str, details: str, extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "message": message, "details": details, "extra_info": extra}


def validate(prompt: Any, partial: list[str] | None, catalogue: Catalogue) -> tuple[Any, ...]:
    """execution.py validate_prompt of 0.38: an unknown or missing class is `missing_node_type` with
    extra_info (node_id, class_type, node_title); a cycle reached from an output puts `dependency_cycle`
    in node_errors for every node on it. Everything else as 0.3.64 (validate.validate_prompt)."""
    if isinstance(prompt, dict):
        for x, node in prompt.items():
            if not isinstance(node, dict):
                break
            if "class_type" not in node:
                title = (node.get("_meta") or {}).get("title") if isinstance(node.get("_meta"), dict) else None
                message = f"Node '{title or f'ID #{x}'}' has no class_type. The workflow may be corrupted or a " \
                          "custom node is missing."
                return False, _error("missing_node_type", message, f"Node ID '#{x}'",
                                     {"node_id": x, "class_type": None, "node_title": title}), [], {}
            class_type = node["class_type"]
            if catalogue.get(class_type) is None:
                meta = node.get("_meta") if isinstance(node.get("_meta"), dict) else {}
                title = meta.get("title", class_type)
                return False, _error("missing_node_type", f"Node '{title}' not found. The custom node may not be "
                                     "installed.", f"Node ID '#{x}'",
                                     {"node_id": x, "class_type": class_type, "node_title": title}), [], {}
        cycle = _cycle(prompt, partial, catalogue)
        if cycle:
            return _cycle_answer(prompt, cycle)
    return validate_prompt(prompt, partial, catalogue)


def _cycle(prompt: dict[str, Any], partial: list[str] | None, catalogue: Catalogue) -> list[str]:
    """The first cycle met walking the links up from each output node, as a path that ends where it began."""
    outputs = [x for x, n in prompt.items() if _is_output(n, catalogue) and (partial is None or x in partial)]
    done: set[str] = set()

    def walk(node_id: str, path: list[str]) -> list[str]:
        if node_id in path:
            return [*path[path.index(node_id):], node_id]
        if node_id in done or node_id not in prompt:
            return []
        inputs = prompt[node_id].get("inputs") if isinstance(prompt[node_id].get("inputs"), dict) else {}
        for value in inputs.values():
            if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
                found = walk(value[0], [*path, node_id])
                if found:
                    return found
        done.add(node_id)
        return []

    for output in outputs:
        found = walk(output, [])
        if found:
            return found
    return []


def _is_output(node: dict[str, Any], catalogue: Catalogue) -> bool:
    entry = catalogue.get(node.get("class_type"))
    return bool(entry is not None and entry.output_node)


def _cycle_answer(prompt: dict[str, Any], path: list[str]) -> tuple[Any, ...]:
    nodes = list(dict.fromkeys(path))
    details = " -> ".join(f"{n} ({prompt[n]['class_type']})" for n in path)
    node_errors = {}
    for node_id in nodes:
        reason = _error("dependency_cycle", "Dependency cycle detected", details,
                        {"node_id": node_id, "cycle_nodes": nodes})
        node_errors[node_id] = {"errors": [reason], "dependent_outputs": [],
                                "class_type": prompt[node_id]["class_type"]}
    error = _error("prompt_outputs_failed_validation", "Prompt outputs failed validation",
                   f"Dependency cycle detected: {details}", {})
    return False, error, [], node_errors


# -- the server's hooks -----------------------------------------------------------------------------------


def output_ids(item: dict[str, Any]) -> dict[str, Any]:
    """0.38 output items carry an asset `id` and a `preview_id` (stable per file, so the executed message
    and the history entry agree)."""
    if not isinstance(item, dict) or "filename" not in item:
        return item
    key = f"{item.get('type')}/{item.get('subfolder')}/{item.get('filename')}"
    asset = str(uuid.uuid5(uuid.NAMESPACE_URL, key))
    return {**item, "id": asset, "preview_id": asset}


def decorate_outputs(outputs: Any) -> Any:
    if not isinstance(outputs, dict):
        return outputs
    return {node: ({kind: [output_ids(i) for i in items] if isinstance(items, list) else items
                    for kind, items in out.items()} if isinstance(out, dict) else out)
            for node, out in outputs.items()}


class Version:
    """The server's answers as one ComfyUI version; `new` is False for 0.3.64 (every hook a no-op)."""

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.options = server.options
        self.new = self.options.comfyui_version == NEW
        self.assets = AssetsLock(database_path(self.options))

    # start-up, cache
    def starting(self) -> None:
        self.assets.acquire()

    def stopped(self) -> None:
        self.assets.release()

    def evicts_cache(self) -> bool:
        """RAM_PRESSURE (0.38's default cache) frees cached outputs under memory pressure, which the fake
        stands for with the `ram_pressure` knob; --cache-classic keeps the old cache."""
        return self.new and not self.options.cache_classic and self.options.ram_pressure

    # answers
    def system_stats(self, body: dict[str, Any]) -> dict[str, Any]:
        body["system"]["comfyui_version"] = VERSION_STRINGS[self.options.comfyui_version]
        if self.new:
            body["system"]["os"] = sys.platform  # "linux", where 0.3.64 said os.name ("posix")
            body["system"]["deploy_environment"] = "local-git"
            if not self.options.cpu:  # every visible device, the primary one first
                first = body["devices"][0]
                body["devices"] = [first] + [{**first, "name": f"cuda:{i} fake_comfy GPU", "index": i}
                                             for i in range(1, self.options.device_count)]
        return body

    def features(self, body: dict[str, Any]) -> dict[str, Any]:
        if self.new:
            body = {**body, "supports_model_type_tags": True, "extension": {"manager": {"supports_v4": True}},
                    "node_replacements": True, "assets": not self.options.disable_assets}
        return body

    def view_headers(self, content_type: str, filename: str, headers: dict[str, str]) -> dict[str, str]:
        if self.new and content_type in DANGEROUS_TYPES:
            safe = filename.replace("\\", "\\\\").replace('"', '\\"')
            return {"X-Content-Type-Options": "nosniff", "Vary": "Sec-Fetch-Dest", "Cache-Control": "no-store",
                    "Content-Disposition": f'attachment; filename="{safe}"', "Content-Type": "application/octet-stream"}
        return headers

    def ws_message(self, event: str, data: Any) -> Any:
        if not self.new or not isinstance(data, dict):
            return data
        if event == "executed" and isinstance(data.get("output"), dict):
            return {**data, "output": decorate_outputs({"n": data["output"]})["n"]}
        if event == "progress_state" and isinstance(data.get("nodes"), dict):
            nodes = {k: ({**v, "activity": v.get("state")} if isinstance(v, dict) else v)
                     for k, v in data["nodes"].items()}
            return {**data, "nodes": nodes}
        return data

    def history_result(self, result: dict[str, Any]) -> dict[str, Any]:
        if self.new and "outputs" in result:
            return {**result, "outputs": decorate_outputs(result["outputs"])}
        return result

    def ended(self, prompt_id: str) -> None:
        """0.38 broadcasts message types a 0.3.64 client never saw (the assets seeder's), to everyone."""
        if self.new and not self.options.disable_assets:
            self.server.hub.post("assets.seed.completed", {"prompt_id": prompt_id, "seeded": 1})

    def prompt_id(self, json_data: dict[str, Any]) -> str | None:
        """POST /prompt's id: 0.3.64 takes anything (str()), 0.38 mints a uuid4 for a missing one and refuses
        (None) any other spelling than a lowercase hyphenated UUID."""
        given = json_data.get("prompt_id")
        if not self.new:
            return str(json_data.get("prompt_id", uuid.uuid4()))
        if given is None:
            return str(uuid.uuid4())
        return given if valid_job_id(given) else None



INVALID_PROMPT_ID = {"type": "invalid_prompt_id", "message": "prompt_id must be a valid UUID",
                     "details": "prompt_id must be a UUID string in canonical lowercase hyphenated form; omit it to "
                                "let the server generate one", "extra_info": {}}
