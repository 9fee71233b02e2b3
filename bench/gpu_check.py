"""One short check on a machine with an NVIDIA GPU, of what no CPU can show (run it there by hand; CI has no GPU).

1. NVML discovery (comfysup.gpus.discover): each GPU's index, name, UUID and memory.
2. ``gpus = "auto"``: one slot per GPU, each ComfyUI launched with ``--cuda-device N`` on its own port.
3. ``comfysup run`` on that config, with a stand-in for ComfyUI that does what ComfyUI's main.py does with
   ``--cuda-device`` (sets CUDA_VISIBLE_DEVICES before torch is imported) and then holds ``--hold-mb`` of VRAM
   with torch (a model loaded and kept), then serves as fake_comfy: the example jobs are done; /metrics shows the
   GPU's memory; the server's VRAM, read by NVML per process, is above ``[comfyui] idle_vram_free_mb``, so the
   supervisor asks it to POST /free and, as the stand-in keeps its memory, restarts it.

    python bench/gpu_check.py [--hold-mb 2048] [--seconds 120]

Needs torch with CUDA, pynvml (nvidia-ml-py), and comfysup's own requirements. Prints what it saw; exits 1 when
a check failed.
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module for everything imported after it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

REPO = Path(__file__).resolve().parent.parent
STAND_IN = '''
import os, runpy, sys
args = sys.argv[1:]
if "--cuda-device" in args:  # what ComfyUI's main.py does before it imports torch
    os.environ["CUDA_VISIBLE_DEVICES"] = args[args.index("--cuda-device") + 1]
import torch
held = torch.empty(int(os.environ["GPU_CHECK_HOLD_MB"]) * 2**20, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
print(f"stand-in pid {os.getpid()}: holding {held.numel() >> 20} MiB on {torch.cuda.get_device_name(0)} "
      f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})", flush=True)
sys.argv = [os.environ["GPU_CHECK_FAKE"], *args]
runpy.run_path(os.environ["GPU_CHECK_FAKE"], run_name="__main__")
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return answer.read().decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hold-mb", type=int, default=2048)
    parser.add_argument("--seconds", type=float, default=120.0)
    args = parser.parse_args()
    failed: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failed.append(what)

    from comfysup.config import load_config
    from comfysup.gpus import discover

    found = discover()
    print("discovery:", found.note or "", [(g.index, g.name, g.uuid, g.memory_total_mb) for g in found.gpus])
    check(bool(found.gpus), "NVML finds at least one GPU")
    if not found.gpus:
        return 1

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    (work / "stand_in.py").write_text(STAND_IN)
    metrics_port, base_port = free_port(), free_port()
    (work / "config.toml").write_text(f"""
[queue]
path = "{work}/queue.db"
[store]
dir = "{work}/results"
[comfyui]
main = "{work}/stand_in.py"
gpus = "auto"
base_port = {base_port}
base_directory = "{work}/comfyui"
idle_vram_free_mb = {max(1, args.hold_mb // 2)}
[metrics]
listen = "127.0.0.1:{metrics_port}"
""")
    config = load_config(work / "config.toml")
    from comfysup.supervisor.children import build_units

    units = build_units(config, dict(os.environ))
    print("slots:", [(u.name, u.device, u.url) for u in units])
    check(len(units) == len(found.gpus) and all(u.name.startswith("gpu") for u in units),
          "gpus = 'auto' makes one slot per GPU")

    env = {**os.environ, "GPU_CHECK_HOLD_MB": str(args.hold_mb), "GPU_CHECK_FAKE": str(REPO / "fake_comfy/main.py"),
           "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "comfysup"]
    log = open(work / "run.log", "w")  # noqa: SIM115
    run = subprocess.Popen([*cli, "run", "--config", str(work / "config.toml")], env=env, stdout=log,
                           stderr=subprocess.STDOUT)
    try:
        jobs = REPO / "comfysup/data/examples/jobs.jsonl"
        submitted = subprocess.run([*cli, "submit", "--config", str(work / "config.toml"), "--wait", str(jobs)],
                                   env=env, capture_output=True, text=True, timeout=args.seconds)
        print(submitted.stdout[-1500:], submitted.stderr[-1500:])
        check(submitted.returncode == 0, "the example jobs are done on the GPU slots")
        import psutil

        servers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"]
                   and str(work / "stand_in.py") in " ".join(p.info["cmdline"])]
        lines = [" ".join(p.info["cmdline"]) for p in servers]
        print("servers:", *lines, sep="\n  ")
        check(bool(servers) and all("--cuda-device" in line for line in lines),
              "each launched ComfyUI has --cuda-device")
        import pynvml

        pynvml.nvmlInit()
        listed = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
        print("NVML's processes on GPU 0:", [(p.pid, p.usedGpuMemory) for p in listed],
              "servers' pids here:", [p.pid for p in servers])
        metrics = get(f"http://127.0.0.1:{metrics_port}/metrics")
        gpu_lines = [line for line in metrics.splitlines() if line.startswith("comfysup_gpu")]
        print(*gpu_lines[:12], sep="\n")
        check(any("memory" in line for line in gpu_lines), "/metrics shows the GPU's memory")
        deadline = time.monotonic() + args.seconds
        freed = restarted = False
        while time.monotonic() < deadline and not (freed and restarted):
            text = (work / "run.log").read_text(errors="replace")
            freed = "of VRAM while idle (above idle_vram_free_mb" in text
            restarted = "of VRAM held while idle after POST /free" in text
            time.sleep(1)
        status = subprocess.run([*cli, "status", "--config", str(work / "config.toml")], env=env,
                                capture_output=True, text=True, timeout=30)
        print(status.stdout[-3000:])
        check(freed, "an idle server above idle_vram_free_mb is asked to POST /free")
        check(restarted, "still above it after /free, it is restarted")
    finally:
        run.terminate()
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
        log.close()
        print((work / "run.log").read_text()[-4000:])
    print("FAILED: " + "; ".join(failed) if failed else "all checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
