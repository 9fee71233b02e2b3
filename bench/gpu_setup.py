"""bench/gpu.py's machine: what it expects there, the checkpoint, the ComfyUI server, NVML's busy fraction.

On the GPU machine everything comes from the working tree's ``.gpu/`` (an ignored folder, carried): ComfyUI's
tree in ``.gpu/comfyui.tar.xz`` (about 3 MiB; unpacked into ``/tmp/gpu-comfyui``) and the wheels python3 there
lacks in ``.gpu/whl`` (about 50 MiB, av's 35 of them), installed into ``/tmp/gpu-site`` by the command that
starts the bench (``RUN``), which puts it and the working tree on PYTHONPATH for every process the bench
starts. ``prepare()`` fills ``.gpu/`` here from COMFYUI_DIR and the package index. With ``--cpu`` (this
machine) COMFYUI_DIR and COMFYUI_PYTHON name ComfyUI and its environment, and the proxy's is bench/real.py's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from real import free_port, wait_until

from comfysup.comfy import probe

ROOT = Path(__file__).resolve().parents[1]
CARRIED = ROOT / ".gpu"
SITE = Path("/tmp/gpu-site")
CHECKPOINT = "sd15_random.safetensors"
WHEELS = ("torchsde", "trampoline", "av", "alembic", "mako", "sqlalchemy", "greenlet", "kornia", "kornia-rs",
          "spandrel", "pydantic", "pydantic-core", "pydantic-settings", "annotated-types", "typing-inspection",
          "python-dotenv", "tomli-w", "websocket-client", "blake3", "comfy-api-proxy", "comfy-sdk")
"""What python3 on the GPU machine lacks (its image lists the rest: torch, numpy, aiohttp, transformers, ...)."""
RUN = ("python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site .gpu/whl/*.whl && "
       "PYTHONPATH=/tmp/gpu-site:$PWD python3 bench/gpu.py")
"""The command on the GPU machine: the wheels first, since this bench's own imports need some of them."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")


@dataclass
class Env:
    comfyui: Path  # ComfyUI's tree
    python: str  # the Python that runs ComfyUI and makes the checkpoint
    proxy_venv: Path  # an environment with comfy-api-proxy and comfy-sdk (bench/real.py's proxy_tool)
    cpu: bool  # ComfyUI with --cpu

    def describe(self) -> str:
        device = "--cpu" if self.cpu else "--cuda-device 0"
        return f"ComfyUI {version(self)} {device} ({self.comfyui}); {os.cpu_count()} CPUs"


def version(env: Env) -> str:
    text = (env.comfyui / "comfyui_version.py").read_text()
    found = re.search(r"__version__ = \"([^\"]+)\"", text)
    return found.group(1) if found else "?"


def environment(cpu: bool) -> Env:
    """Where ComfyUI, its Python and the proxy are; on the GPU machine the carried wheels installed first."""
    if cpu:
        comfyui = os.environ.get("COMFYUI_DIR")
        if not comfyui:
            raise SystemExit("--cpu: set COMFYUI_DIR to a ComfyUI checkout and COMFYUI_PYTHON to its Python")
        return Env(Path(comfyui), os.environ.get("COMFYUI_PYTHON", sys.executable),
                   Path.home() / ".cache" / "comfysup-bench" / "proxy-venv", True)
    tree, comfyui = CARRIED / "comfyui.tar.xz", Path("/tmp/gpu-comfyui")
    if not tree.is_file():
        raise SystemExit(f"no {tree}: carry .gpu/ (made here by bench/gpu.py --prepare)")
    if not (comfyui / "main.py").is_file():
        comfyui.mkdir(parents=True, exist_ok=True)
        subprocess.run(["tar", "-xJf", str(tree), "-C", str(comfyui), "--strip-components=1"], check=True)
    if str(SITE) not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        raise SystemExit(f"the carried wheels are not installed: run {RUN}")
    return Env(comfyui, sys.executable, proxy_venv(), False)


def proxy_venv() -> Path:
    """An environment over this Python whose bin/ holds the proxy's command (installed in SITE)."""
    venv = Path("/tmp/gpu-proxy-venv")
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True)
        (venv / "bin" / "comfy-api-proxy").symlink_to(SITE / "bin" / "comfy-api-proxy")
    return venv


def checkpoint(env: Env) -> Path:
    """The SD1.5-architecture checkpoint of random weights, made once per machine (bench/make_checkpoint.py)."""
    folder = Path.home() / ".cache" / "comfysup-bench" if env.cpu else Path("/tmp/gpu-bench")
    path = folder / CHECKPOINT
    if not path.exists():
        subprocess.run([env.python, str(ROOT / "bench" / "make_checkpoint.py"), "--comfyui", str(env.comfyui),
                        "--device", "cpu" if env.cpu else "cuda", str(path)], check=True)
    return path


def start_comfyui(env: Env, tmp: Path, cpu: bool) -> tuple[subprocess.Popen, str, Path]:
    """A fresh ComfyUI with the checkpoint in its models folder; its process, URL and base directory."""
    base = tmp / "comfyui"
    for folder in ("custom_nodes", "models/checkpoints", "frontend"):
        (base / folder).mkdir(parents=True)
    (base / "models" / "checkpoints" / CHECKPOINT).symlink_to(checkpoint(env))
    port, log = free_port(), base / "comfyui.log"
    command = [env.python, str(env.comfyui / "main.py"), "--listen", "127.0.0.1", "--port", str(port),
               "--base-directory", str(base), "--database-url", f"sqlite:///{base / 'comfyui.db'}",
               "--disable-auto-launch", "--front-end-root", str(base / "frontend"),
               *(["--cpu"] if cpu else ["--cuda-device", "0"])]
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: probe.answers(url, timeout_seconds=1), "ComfyUI", 300, proc, log)
    return proc, url, base


def spans(url: str, prefixes: set[str]) -> list[tuple[float, float]]:
    """(start, end) in epoch seconds of each of these prompts, from ComfyUI's own timestamps, in order."""
    out = []
    for entry in requests.get(f"{url}/history", timeout=60).json().values():
        save = next(n for n in entry["prompt"][2].values() if n["class_type"] == "SaveImage")
        if re.sub(r"^comfysup/[^/]+/", "", save["inputs"]["filename_prefix"]) not in prefixes:
            continue
        stamps = {kind: data["timestamp"] / 1000 for kind, data in entry["status"]["messages"] if "timestamp" in data}
        if "execution_start" in stamps and "execution_success" in stamps:
            out.append((stamps["execution_start"], stamps["execution_success"]))
    return sorted(out)


class Busy:
    """The GPU's utilisation polled through NVML every ``step`` seconds while the block runs; NaN without NVML."""

    def __init__(self, step: float = 0.005) -> None:
        self.step, self.samples, self.why = step, [], ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml, self._handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.name = pynvml.nvmlDeviceGetName(self._handle)
        except Exception as exc:  # no pynvml, no driver, no GPU: the figures say so
            self._nvml, self.why = None, f"{type(exc).__name__}: {exc}"

    def describe(self) -> str:
        if self._nvml is None:
            return f"NVML absent ({self.why}): the busy fractions are not measured"
        return f"GPU {self.name}, NVML utilisation polled every {self.step * 1000:g} ms"

    def _loop(self) -> None:
        while not self._stop.wait(self.step):
            rate = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            self.samples.append((time.time(), rate.gpu / 100.0))

    def fraction(self, t0: float, t1: float) -> float:
        values = [v for t, v in self.samples if t0 <= t <= t1]
        return sum(values) / len(values) if values else float("nan")

    def __enter__(self) -> Busy:
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def prepare() -> None:
    """Fill .gpu/ here: ComfyUI's tree from COMFYUI_DIR and the wheels of WHEELS for CPython 3.12 x86-64."""
    source = Path(os.environ.get("COMFYUI_DIR", "/work/comfyui"))
    CARRIED.mkdir(exist_ok=True)
    skip = ("__pycache__", "output", "input", "temp", "user", "models", "custom_nodes", "tests", "tests-unit")
    subprocess.run(["tar", "-cJf", str(CARRIED / "comfyui.tar.xz"), *(f"--exclude=comfyui/{s}" for s in skip),
                    "--exclude=*.pyc", "--transform", "s,^[^/]*,comfyui,", "-C", str(source.parent), source.name],
                   check=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(CARRIED / "whl"),
                    *WHEELS], check=True)
    size = sum(f.stat().st_size for f in CARRIED.rglob("*") if f.is_file())
    print(f"{CARRIED}: {size / 2**20:.1f} MiB (with the working tree, at most 64 MiB travel)")
