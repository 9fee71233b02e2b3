"""The workload the queue benches share: one SDXL-shaped API workflow of about 10 KB.

Imported by bench/queue.py and bench/scale.py, which put this folder at the end of sys.path (never first:
bench/queue.py would shadow the standard library's queue module).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any


def workflow_10kb() -> dict[str, Any]:
    """An SDXL-shaped API workflow padded with prompt text to about 10 KB, as real ones are."""
    prompt = ("a lighthouse on a cliff at dusk, volumetric light, 35mm, film grain, detailed rocks, "
              "crashing waves, seabirds, soft clouds, ") * 4
    wf: dict[str, Any] = {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl_base_1.0.safetensors"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 1024, "height": 1024, "batch_size": 1}},
        "3": {"class_type": "KSampler", "inputs": {"seed": 0, "steps": 30, "cfg": 7.0, "sampler_name": "euler",
                                                   "scheduler": "normal", "denoise": 1.0, "model": ["4", 0],
                                                   "positive": ["6", 0], "negative": ["7", 0],
                                                   "latent_image": ["5", 0]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "bench", "images": ["8", 0]}},
    }
    n = 10
    while len(json.dumps(wf)) < 10_000:
        wf[str(n)] = {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": ["4", 1]}}
        n += 1
    wf["6"] = {"class_type": "ConditioningCombine", "inputs": {"conditioning_1": ["10", 0],
                                                                "conditioning_2": ["11", 0]}}
    wf["7"] = {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry, low quality", "clip": ["4", 1]}}
    return wf


def pg_database(admin_url: str, prefix: str = "comfysup_bench") -> tuple[str, str, Callable[[], None]]:
    """A fresh database of the benchmark's own on the server at ``admin_url``: its URL, its name (PostgreSQL's
    processes that serve it carry it in their command line) and a function that drops it."""
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")

    def drop() -> None:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    return urlunsplit(urlsplit(admin_url)._replace(path=f"/{name}")), name, drop
