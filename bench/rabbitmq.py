"""RabbitMQ front door benchmark: jobs per second ingested from the broker against ``comfysup submit``, and
the time from publish to claim for an idle runner.

Run: ``.venv/bin/python bench/rabbitmq.py`` (``--quick`` for a smaller run; the broker at
``$COMFYSUP_TEST_RABBITMQ``, default amqp://guest:guest@127.0.0.1:5672/). Not a test: it prints figures for
the README and asserts only that every job arrived once.

- ingest: N jobs of the example workflow (inline, with a ``set`` each) published to a fresh quorum queue
  with confirms, then one consumer (comfysup.broker.consumer.Consumer, prefetch P) takes them into a SQLite
  queue: jobs per second from its start to the last insert, for P = 50 (the default) and 500. Against it,
  the same lines as a jobs.jsonl given to ``comfysup submit`` (in process, through the CLI's code).
- latency: an idle runner's loop (claim; none: ``wait_for_work``, the runner's 0.25 s idle wait on SQLite)
  and a consumer beside it; one job published at a random moment; the time from publish to its insert
  (the consumer's part) and to its claim, median and p95.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# bench/ itself must not be on the path: its queue.py would shadow the standard library's queue module.
sys.path[:] = [str(ROOT), str(ROOT / "tests")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]

from broker_support import Broker, Running, broker_answers, broker_config, job_line  # noqa: E402

from comfysup.broker.consumer import Consumer  # noqa: E402
from comfysup.cli import main as cli  # noqa: E402
from comfysup.queue import open_queue  # noqa: E402

TRIVIAL = json.loads((ROOT / "examples" / "workflows" / "trivial.json").read_text())


def lines(count: int, tag: str) -> list[dict]:
    return [{**job_line(n, tag=tag), "workflow": TRIVIAL} for n in range(count)]


def ingest(count: int, prefetch: int) -> float:
    broker = Broker()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = broker_config(Path(tmp), broker, prefetch=prefetch)
            jobs = lines(count, broker.tag)
            broker.publish([json.dumps(j).encode() for j in jobs], [j["id"] for j in jobs])
            queue = open_queue(config)
            started = time.perf_counter()
            with Running(Consumer(config, queue)) as consumer:
                while consumer.counts["acked"] < count:
                    time.sleep(0.01)
                seconds = time.perf_counter() - started
            assert queue.reads.status().counts["queued"] == count
            queue.close()
            return count / seconds
    finally:
        broker.delete()


def submit(count: int) -> float:
    broker = Broker()
    with tempfile.TemporaryDirectory() as tmp:
        config = broker_config(Path(tmp), broker)
        toml = Path(tmp) / "config.toml"
        toml.write_text(f'[queue]\npath = "{config.queue.path}"\n')
        path = Path(tmp) / "jobs.jsonl"
        path.write_text("".join(json.dumps(j) + "\n" for j in lines(count, broker.tag)))
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli(["submit", "--config", str(toml), str(path)]) == 0
        return count / (time.perf_counter() - started)


def latency(samples: int) -> list[tuple[float, float]]:
    broker = Broker()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = broker_config(Path(tmp), broker)
            queue, runner_queue = open_queue(config), open_queue(config)
            claimed: dict[str, float] = {}
            stop = threading.Event()

            def runner() -> None:  # the runner's idle loop (comfysup.runner.loop): claim, else wait
                while not stop.is_set():
                    claim = runner_queue.leases.claim("bench", "gpu0", 30)
                    if claim is None:
                        runner_queue.wait_for_work(0.25)
                        continue
                    claimed[claim.id] = time.perf_counter()
                    runner_queue.leases.complete(claim, [])

            thread = threading.Thread(target=runner, daemon=True)
            out = []
            with Running(Consumer(config, queue)):
                thread.start()
                time.sleep(1.0)
                rng = random.Random(1)
                for job in lines(samples, broker.tag):
                    sent, sent_wall = time.perf_counter(), time.time()
                    broker.publish([json.dumps(job).encode()], [job["id"]])
                    while job["id"] not in claimed:
                        time.sleep(0.001)
                    inserted = queue.reads.get(job["id"]).submitted_at - sent_wall
                    out.append((claimed[job["id"]] - sent, inserted))
                    time.sleep(rng.uniform(0.3, 0.8))  # any phase of the runner's idle wait
                stop.set()
                thread.join(5)
            queue.close()
            runner_queue.close()
            return out
    finally:
        broker.delete()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if not broker_answers():
        print("RabbitMQ does not answer (see .ci/rabbitmq)", file=sys.stderr)
        return 1
    count = 2000 if args.quick else 10000
    print(f"ingest of {count} jobs (SQLite queue, one consumer):")
    for prefetch in (50, 500):
        print(f"  broker, prefetch {prefetch:3}: {ingest(count, prefetch):8.0f} jobs/s")
    print(f"  comfysup submit      : {submit(count):8.0f} jobs/s")
    samples = latency(10 if args.quick else 40)
    for name, values in (("publish to insert (consumer)", [i for _, i in samples]),
                         ("publish to claim, idle runner (SQLite, 0.25 s idle wait)", [c for c, _ in samples])):
        ms = sorted(v * 1000 for v in values)
        print(f"{name}, {len(ms)} jobs: median {statistics.median(ms):.0f} ms, "
              f"p95 {ms[max(0, int(len(ms) * 0.95) - 1)]:.0f} ms, max {ms[-1]:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
