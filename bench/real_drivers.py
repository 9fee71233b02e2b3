"""bench/real_drivers.py: the two clients of bench/real.py that are not comfysup, each a process of its own.

    python bench/real_drivers.py bare SPEC.json      # ComfyUI's own HTTP + WebSocket API, nothing durable
                                                     # ("fsync": true in SPEC: each file fsynced)
    python bench/real_drivers.py sdk SPEC.json       # comfy-sdk against comfy-api-proxy (COMFY_BASE_URL)

SPEC.json: ``{"url": ComfyUI's (bare only), "warm": [prompt, ...], "batches": [[prompt, ...], ...], "out":
folder}``. Each driver runs the warm-up prompts and prints ``ready``; then, for each batch, waits for a line
on stdin, runs the batch's prompts and prints one JSON line ``{"t0", "t1", "files": {prefix: [path, ...]}}``
(epoch seconds, so bench/real.py can set them against ComfyUI's own timestamps); at the end it waits for
stdin to close, so that the bench reads its CPU time and memory before it exits. A job's key is its
SaveImage ``filename_prefix``.

The sdk driver runs in the bench's own virtual environment (comfy-sdk from PyPI), so this file imports
nothing but the standard library at the top.
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, and bench/queue.py would shadow the standard
# library's queue module (urllib3 and httpx import it).
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import json
import os
import time
import uuid
from typing import Any


def prefix_of(prompt: dict[str, Any]) -> str:
    return next(n["inputs"]["filename_prefix"] for n in prompt.values() if n["class_type"] == "SaveImage")


def wait_for_end(ws: Any, prompt_id: str) -> None:
    """Until the WebSocket says ``executing`` with ``node: null`` for this prompt: ComfyUI sends it after
    the history entry is written (bench/e2e.py's and bench/runner.py's bare clients wait the same way)."""
    while True:
        message = ws.recv()
        if isinstance(message, str):
            data = json.loads(message)
            if data["type"] == "executing" and data["data"].get("node") is None \
                    and data["data"].get("prompt_id") == prompt_id:
                return


def wait_for_start(ws: Any, prompt_id: str) -> None:
    """Until the WebSocket says ``execution_start`` for this prompt (``bare-ahead`` posts the next one then)."""
    while True:
        message = ws.recv()
        if isinstance(message, str):
            data = json.loads(message)
            if data["type"] == "execution_start" and data["data"].get("prompt_id") == prompt_id:
                return


def bare(spec: dict[str, Any]) -> None:
    """What a user writes against ComfyUI's own API, one prompt at a time: POST /prompt with a client id,
    wait on the WebSocket for that prompt's ``executing`` with ``node: null`` (sent after the history is
    written), GET /history/{id}, GET /view of each image, write it. urllib3 (requests' own transport, leaner than
    the requests most such scripts use; comfysup's runner uses the standard library's http.client since 2026-12)
    and websocket-client (comfysup's too).

    ``"ahead": true`` in SPEC (``bare-ahead``): the next prompt is posted when this one's ``execution_start``
    comes, as comfysup's queue_ahead does, with nothing durable: what overlapping costs ComfyUI itself."""
    from urllib.parse import urlencode

    import urllib3
    import websocket

    url, out, durable, ahead = spec["url"], Path(spec["out"]), spec.get("fsync", False), spec.get("ahead", False)
    pool = urllib3.connection_from_url(url, maxsize=1, retries=False)
    client_id = str(uuid.uuid4())
    ws = websocket.create_connection(f"ws{url[4:]}/ws?clientId={client_id}", timeout=60,
                                     skip_utf8_validation=True)

    def post(prompt: dict[str, Any]) -> str:
        prompt_id = str(uuid.uuid4())
        body = json.dumps({"prompt": prompt, "prompt_id": prompt_id, "client_id": client_id}).encode()
        answer = pool.urlopen("POST", "/prompt", body=body, headers={"Content-Type": "application/json"})
        if answer.status != 200:
            raise SystemExit(f"POST /prompt: {answer.status} {answer.data[:300]!r}")
        return prompt_id

    def run(prompts: list[dict[str, Any]]) -> dict[str, list[str]]:
        files: dict[str, list[str]] = {}
        posted = post(prompts[0]) if ahead and prompts else None
        for n, prompt in enumerate(prompts):
            if ahead:
                prompt_id = posted
                wait_for_start(ws, prompt_id)
                posted = post(prompts[n + 1]) if n + 1 < len(prompts) else None
            else:
                prompt_id = post(prompt)
            wait_for_end(ws, prompt_id)
            entry = json.loads(pool.urlopen("GET", f"/history/{prompt_id}").data)[prompt_id]
            paths = files.setdefault(prefix_of(prompt), [])
            for output in entry["outputs"].values():
                for image in output.get("images", []):
                    path = out / image["filename"]
                    data = pool.urlopen("GET", f"/view?{urlencode(image)}").data
                    with open(path, "wb") as f:
                        f.write(data)
                        if durable:  # the file on disk before the job counts as done: the floor
                            f.flush()
                            os.fsync(f.fileno())
                    paths.append(str(path))
        return files

    measure(spec, run)
    ws.close()


def sdk(spec: dict[str, Any]) -> None:
    """comfy-sdk as its README runs a batch: submit every workflow first (each ``client.submit`` returns at
    once: all jobs queued in ComfyUI), then ``job.result()`` each in turn and ``output.to_file`` every output.
    Its defaults: ``Comfy()`` reads COMFY_BASE_URL, polls GET /api/v2/jobs/{id} with its own backoff."""
    from comfy_sdk import Comfy

    out = Path(spec["out"])
    client = Comfy()

    def run(prompts: list[dict[str, Any]]) -> dict[str, list[str]]:
        jobs = [(prefix_of(p), client.submit(client.workflows.from_json(p))) for p in prompts]
        files: dict[str, list[str]] = {}
        for prefix, job in jobs:
            job.result()
            paths = files.setdefault(prefix, [])
            for n, output in enumerate(job.outputs):
                paths.append(str(output.to_file(out / f"{prefix}_{n}_{output.name}")))
        return files

    measure(spec, run)
    client.close()


def sdk_run(spec: dict[str, Any]) -> None:
    """comfy-sdk's getting-started form, one job at a time: ``client.run(wf)`` (submit, then poll to the
    end), then ``output.to_file``. The plain configuration beside ``sdk``'s submit-everything-first."""
    from comfy_sdk import Comfy

    out = Path(spec["out"])
    client = Comfy()

    def run(prompts: list[dict[str, Any]]) -> dict[str, list[str]]:
        files: dict[str, list[str]] = {}
        for prompt in prompts:
            job = client.run(client.workflows.from_json(prompt))
            prefix = prefix_of(prompt)
            files[prefix] = [str(o.to_file(out / f"{prefix}_{n}_{o.name}")) for n, o in enumerate(job.outputs)]
        return files

    measure(spec, run)
    client.close()


def measure(spec: dict[str, Any], run: Any) -> None:
    run(spec["warm"])
    print("ready", flush=True)
    for batch in spec["batches"]:
        sys.stdin.readline()
        t0 = time.time()
        files = run(batch)
        t1 = time.time()
        print(json.dumps({"t0": t0, "t1": t1, "files": files}), flush=True)
    sys.stdin.read()  # the bench reads this process's CPU time and memory, then closes stdin


if __name__ == "__main__":
    kind, spec_path = sys.argv[1], sys.argv[2]
    {"bare": bare, "sdk": sdk, "sdk-run": sdk_run}[kind](json.loads(Path(spec_path).read_text()))
