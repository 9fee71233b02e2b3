"""bench/gpu.py: comfysup on a real model on an NVIDIA GPU, beside a bare client and Comfy's proxy + SDK, in one run.

One ComfyUI server (``--cuda-device 0``; ``--cpu`` with ``--cpu``) runs text-to-image with an SD1.5-architecture
checkpoint of random weights made on this machine (bench/make_checkpoint.py: the UNet, VAE and text encoder
compute as a trained model's do; the images are noise): 512x512, 20 steps, euler, each prompt its own seed. The
tools take turns on it (the order turns by one each run), each with ``--prompts`` prompts a batch, after one
warm-up prompt of its own: ``bare`` (bench/real_drivers.py: POST /prompt, the WebSocket, /history, /view),
``comfysup`` (``comfysup work``, ``queue_ahead = true``, the files read from the server's output folder; timed
from ``comfysup submit`` to the last job's ``done``) and ``proxy`` (comfy-api-proxy with comfy-sdk submitting every
job first). Per batch: the wall time; the GPU's busy fraction from NVML (utilisation polled every 5 ms) over the
wall time and over the span from the first prompt's start to the last one's end (work queued); the gaps between
one prompt's end and the next one's start from ComfyUI's own timestamps (``execution_success`` and
``execution_start``, the WebSocket's messages as its history keeps them). Medians over ``--runs`` runs; the goals
printed met or not met: wall at most 1.00 of the bare client's (paired run by run), busy at least the bare
client's and at least 99 % while work is queued, the median gap at most 2 ms.

On the GPU machine (a copy of the working tree, no internet; python3 there holds PyTorch with CUDA and
nvidia-ml-py), about 6-8 minutes:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu-site .gpu/whl/*.whl &&
        PYTHONPATH=/tmp/gpu-site:$PWD python3 bench/gpu.py          # expects .gpu/ (below); --runs 5 --prompts 10

What must be carried (ignored paths, 64 MiB in all, made here by ``bench/gpu.py --prepare``):

- ``.gpu/comfyui``: ComfyUI's tree (0.3.64, about 16 MiB; its front end is not needed: ``--front-end-root``
  names an empty folder);
- ``.gpu/whl``: the wheels (CPython 3.12, manylinux x86-64) that python3 there lacks: ComfyUI's (torchsde, av,
  alembic, SQLAlchemy, kornia, spandrel, pydantic, ...), comfysup's (tomli-w, websocket-client, blake3) and the
  proxy's and the SDK's, installed into /tmp/gpu-site by the command above (this bench's imports need some).

The checkpoint (about 2 GB) is made there at the start, on the GPU, in about 10-30 s. Here, to know the script
runs (ComfyUI on the CPU, 64x64, 2 steps; NVML absent, which it says):

    COMFYUI_DIR=/work/comfyui COMFYUI_PYTHON=/work/comfyui-venv/bin/python .venv/bin/python bench/gpu.py --cpu
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]

import argparse
import os
import signal
import statistics
import tempfile
from typing import Any

import gpu_setup
from real import TOOL_RUNS, ToolFailed, stop
from real_report import prefix_of, verify

TOOLS = {"bare": "bare", "comfysup": "comfysup-ahead", "proxy": "proxy"}
"""Each tool of this bench and bench/real.py's run of it."""


def text_to_image(seed: int, size: int, steps: int, prefix: str) -> dict[str, Any]:
    """SD1.5 text-to-image as ComfyUI's default workflow has it, at ``size``, ``steps`` of euler."""
    return {
        "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": gpu_setup.CHECKPOINT}},
        "2": {"class_type": "CLIPTextEncode", "inputs": {"text": "a lighthouse on a cliff at dusk", "clip": ["1", 1]}},
        "3": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry", "clip": ["1", 1]}},
        "4": {"class_type": "EmptyLatentImage", "inputs": {"width": size, "height": size, "batch_size": 1}},
        "5": {"class_type": "KSampler", "inputs": {"model": ["1", 0], "seed": seed, "steps": steps, "cfg": 7.0,
                                                   "sampler_name": "euler", "scheduler": "normal",
                                                   "positive": ["2", 0], "negative": ["3", 0],
                                                   "latent_image": ["4", 0], "denoise": 1.0}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["1", 2]}},
        "7": {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": prefix}},
    }


def batch(tag: str, n: int, size: int, steps: int) -> list[dict[str, Any]]:
    return [text_to_image(abs(hash(tag)) % 2**31 + i, size, steps, f"{tag}_{i:04d}") for i in range(n)]


def measure(tool: str, gen: Any, prompts: list, url: str, base: Path, sampler: gpu_setup.Busy,
            posted: int) -> dict[str, Any]:
    """One batch of ``tool``: its figures and what its verification found."""
    m = next(gen)
    checked = verify(url, base, prompts, m, posted)
    spans = gpu_setup.spans(url, {prefix_of(p) for p in prompts})
    queued = (spans[0][0], spans[-1][1]) if spans else (m.t0, m.t1)
    return {"tool": tool, "wall": m.t1 - m.t0, "busy": sampler.fraction(m.t0, m.t1),
            "busy_queued": sampler.fraction(*queued), "gap_ms": checked["idle_ms"], "problems": checked["problems"]}


def median(rows: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in rows if r[key] == r[key]]  # NaN (no NVML) left out
    return (statistics.median(values), min(values), max(values)) if values else (float("nan"),) * 3


def report(rows: list[dict[str, Any]], tools: list[str], runs: int) -> None:
    print(f"\n{'tool':<10} {'wall s (min-max)':>22} {'busy':>6} {'busy queued':>12} {'gap ms (min-max)':>20}")
    for tool in tools:
        mine = [r for r in rows if r["tool"] == tool]
        w, b, q, g = (median(mine, k) for k in ("wall", "busy", "busy_queued", "gap_ms"))
        print(f"{tool:<10} {w[0]:>8.2f} ({w[1]:.2f}-{w[2]:.2f}) {b[0]:>6.3f} {q[0]:>12.3f} "
              f"{g[0]:>8.1f} ({g[1]:.1f}-{g[2]:.1f})")
    if "bare" not in tools or "comfysup" not in tools:
        return
    by_run = {(r["run"], r["tool"]): r for r in rows}
    ratios = [by_run[(n, "comfysup")]["wall"] / by_run[(n, "bare")]["wall"] for n in range(runs)
              if (n, "comfysup") in by_run and (n, "bare") in by_run]
    ours, bare = ([r for r in rows if r["tool"] == t] for t in ("comfysup", "bare"))
    goals = [("wall <= 1.00 of the bare client's (paired)", statistics.median(ratios) if ratios else float("nan"),
              lambda v: v <= 1.0),
             ("busy >= the bare client's", median(ours, "busy")[0] - median(bare, "busy")[0], lambda v: v >= 0),
             ("busy >= 99 % while work is queued", median(ours, "busy_queued")[0], lambda v: v >= 0.99),
             ("median gap <= 2 ms", median(ours, "gap_ms")[0], lambda v: v <= 2.0)]
    print()
    for name, value, ok in goals:
        verdict = "not measured" if value != value else ("met" if ok(value) else "not met")
        print(f"goal {name}: {value:.3f} -> {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="ComfyUI on the CPU, 64x64, 2 steps: to know it runs")
    parser.add_argument("--prepare", action="store_true", help="fill .gpu/ here (ComfyUI tree, wheels), then stop")
    parser.add_argument("--runs", type=int, default=5, help="alternating runs (default 5)")
    parser.add_argument("--prompts", type=int, default=10, help="prompts a batch (default 10; 3 with --cpu)")
    parser.add_argument("--size", type=int, help="image side (default 512; 64 with --cpu)")
    parser.add_argument("--steps", type=int, help="sampler steps (default 20; 2 with --cpu)")
    parser.add_argument("--tools", default=",".join(TOOLS), help=f"comma-separated, of {', '.join(TOOLS)}")
    args = parser.parse_args()
    if args.prepare:
        gpu_setup.prepare()
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size, steps = args.size or (64 if args.cpu else 512), args.steps or (2 if args.cpu else 20)
    prompts = args.prompts if args.prompts != 10 or not args.cpu else 3
    env = gpu_setup.environment(args.cpu)
    tools = [t for t in args.tools.split(",") if t]
    with tempfile.TemporaryDirectory(prefix="comfysup-gpu-") as name:
        tmp = Path(name)
        server, url, base = gpu_setup.start_comfyui(env, tmp, args.cpu)
        sampler = gpu_setup.Busy()
        print(f"{env.describe()}; {sampler.describe()}; {args.runs} runs of {prompts} prompts {size}x{size}, "
              f"{steps} steps, tools {', '.join(tools)}", flush=True)
        gens, rows, posted = {}, [], 0
        try:
            for tool in tools:
                (tmp / tool).mkdir()
                (tmp / tool / "comfyui").symlink_to(base)  # comfysup reads the files from the server's folder
                warm = batch(f"warm_{tool}", 1, size, steps)
                batches = [batch(f"r{n}_{tool}", prompts, size, steps) for n in range(args.runs)]
                gens[tool] = (TOOL_RUNS[TOOLS[tool]](url, tmp / tool, warm, batches, venv=env.proxy_venv), batches)
            with sampler:
                for run in range(args.runs):
                    for tool in tools[run % len(tools):] + tools[:run % len(tools)]:
                        gen, batches = gens[tool]
                        posted += len(batches[run]) + (1 if run == 0 else 0)  # its warm-up comes first
                        row = {"run": run, **measure(tool, gen, batches[run], url, base, sampler, posted)}
                        rows.append(row)
                        print(f"run {run + 1} {tool:<9} wall {row['wall']:7.2f} s  busy {row['busy']:.3f}  queued "
                              f"{row['busy_queued']:.3f}  gap {row['gap_ms']:6.1f} ms  "
                              f"{'; '.join(row['problems']) or 'verified'}", flush=True)
        except ToolFailed as exc:
            print(f"FAILED: {exc}")
        finally:
            for gen, _ in gens.values():
                gen.close()
            stop(server)
    report(rows, tools, args.runs)
    if any(r["problems"] for r in rows):
        raise SystemExit("some batches failed their verification")


if __name__ == "__main__":
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    main()
