"""bench/fuzz_api.py: the API fuzz test (tests/integration/test_api_fuzz.py) for as long as you like.

An API on a fresh SQLite queue in a temporary folder, served in this process, takes random and malformed requests
(tests/api_fuzz.py: methods, paths, query numbers, headers, deep and huge JSON, broken multipart, bytes that are
not HTTP, slow clients) from C client threads for N seconds. Printed: requests by kind and by status, failures
(a 5xx, or no answer to a whole request), tracebacks logged, the most threads the API used and its RSS growth.
Exit 1 when anything failed.

    .venv/bin/python bench/fuzz_api.py --seconds 300            # a random seed, printed
    .venv/bin/python bench/fuzz_api.py --seconds 60 --seed 42 --clients 8
"""

# ruff: noqa: E402  (the sys.path fix below must run before the other imports)
from __future__ import annotations

import sys
from pathlib import Path

# bench/queue.py would shadow the standard library's queue module for everything imported after it.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import logging
import random
import tempfile
import threading
import time

from tests.api_fuzz import Fuzzer, Report
from tests.api_support import api_config, running_api


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or "Traceback" in record.getMessage():
            self.seen.append(f"{record.name}: {record.getMessage()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    seed = random.randrange(2**32) if args.seed is None else args.seed
    tracebacks = Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("comfysup.api").propagate = True
    with tempfile.TemporaryDirectory() as tmp:
        config = api_config(Path(tmp), max_upload_mb=4, header_timeout_seconds=1.0, body_timeout_seconds=1.0,
                            max_connections=200, max_event_streams=50)
        with running_api(config) as url:
            before = sum(1 for t in threading.enumerate() if not t.name.startswith("fuzz-"))
            started = time.monotonic()
            report = Fuzzer(url, seed).run(args.seconds, clients=args.clients, report=Report())
            elapsed = time.monotonic() - started
    total = sum(report.kinds.values())
    print(f"seed {seed}: {total} requests in {elapsed:.0f} s ({total / elapsed:.0f}/s), {args.clients} clients")
    print("by kind:   " + ", ".join(f"{k} {n}" for k, n in report.kinds.most_common()))
    print("by status: " + ", ".join(f"{s or 'closed'} {n}" for s, n in sorted(report.statuses.items())))
    print(f"threads: {before} before, at most {report.max_threads} during; RSS grew by at most "
          f"{report.max_rss_growth / 2**20:.0f} MiB")
    print(f"failures: {len(report.failures)}; tracebacks logged: {len(tracebacks.seen)}")
    for line in report.failures[:20] + tracebacks.seen[:5]:
        print("  " + line)
    return 1 if report.failures or tracebacks.seen else 0


if __name__ == "__main__":
    sys.exit(main())
