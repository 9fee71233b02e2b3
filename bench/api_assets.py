"""bench/api_assets.py: what an upload through the Comfy API v2 costs (assets).

One ``comfysup api`` process (SQLite queue, assets next to it). For each size given, a fresh random file is
uploaded with comfy-sdk exactly as its README does (``client.assets.from_file(path).commit()``: HEAD by-hash
misses, then the streamed multipart POST), then the same content again from another handle (HEAD hits, the
from-hash mint: no bytes sent). Side by side in the one run: the upload's MiB/s against a plain copy of the
same file with fsync on the same disk (the floor a durable store pays), the second commit's time against the
first, and the API process's peak resident memory above its idle size against the file's size (the upload is
streamed, so the ratio must stay far below 1). Ratios only, no timed assertions.

    .venv/bin/python bench/api_assets.py                 # 1, 16 and 90 MiB
    .venv/bin/python bench/api_assets.py --sizes 4,64
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ itself must not be on the path (its queue.py would shadow the standard library's queue module).
sys.path[:] = [str(ROOT)] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

import argparse
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

import httpx
import psutil
import tomli_w

MIB = 2**20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PeakRss:
    """The highest resident size of a process, sampled every few milliseconds while the block runs."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            self._stop.wait(0.005)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def plain_copy(source: Path, folder: Path) -> float:
    """Seconds to copy ``source`` into ``folder`` and fsync it: the durable floor on this disk."""
    target = folder / "copy.bin"
    started = time.perf_counter()
    with open(source, "rb") as src, open(target, "wb") as out:
        shutil.copyfileobj(src, out, MIB)
        out.flush()
        os.fsync(out.fileno())
    seconds = time.perf_counter() - started
    target.unlink()
    return seconds


def start_api(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = tmp / "config.toml"
    config.write_bytes(tomli_w.dumps({
        "queue": {"path": str(tmp / "queue.db")}, "store": {"dir": str(tmp / "store")},
        "comfyui": {"gpus": "cpu:1"}, "assets": {"max_file_mb": 1024},
        "api": {"listen": f"127.0.0.1:{port}", "max_upload_mb": 1024}}).encode())
    proc = subprocess.Popen([sys.executable, "-m", "comfysup", "api", "--config", str(config)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v2/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("comfysup api did not answer within 30 s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1,16,90", help="file sizes in MiB, comma separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="comfysup-bench-assets-") as name:
        tmp = Path(name)
        proc, url = start_api(tmp)
        os.environ["COMFY_BASE_URL"] = url
        os.environ.pop("COMFY_API_KEY", None)
        from comfy_sdk import Comfy

        try:
            idle = psutil.Process(proc.pid).memory_info().rss
            print(f"comfysup api idle RSS {idle / MIB:.1f} MiB")
            print(f"{'size MiB':>8} {'upload MiB/s':>12} {'copy+fsync MiB/s':>16} {'upload/copy':>11} "
                  f"{'dedup s':>8} {'dedup/upload':>12} {'peak RSS +MiB':>13} {'RSS+/size':>9}")
            with Comfy(timeout=600) as client:
                for size in sizes:
                    source = tmp / f"input-{size}.bin"
                    source.write_bytes(os.urandom(size * MIB))
                    copy_s = plain_copy(source, tmp)
                    with PeakRss(proc.pid) as rss:
                        started = time.perf_counter()
                        first = client.assets.from_file(source)
                        first.commit()
                        upload_s = time.perf_counter() - started
                    started = time.perf_counter()
                    again = client.assets.from_file(source)
                    again.commit()
                    dedup_s = time.perf_counter() - started
                    assert first.created_new and not again.created_new  # same name: the same record again
                    grown = max(0, rss.peak - idle) / MIB
                    print(f"{size:>8} {size / upload_s:>12.1f} {size / copy_s:>16.1f} {copy_s / upload_s:>11.2f} "
                          f"{dedup_s:>8.3f} {dedup_s / upload_s:>12.3f} {grown:>13.1f} {grown / size:>9.3f}")
                    source.unlink()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
