"""``comfysup work``: runners against ComfyUI servers that are already running (nothing is launched)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any

from comfysup.commands._common import config_from
from comfysup.config import Config
from comfysup.errors import ComfysupError, UsageError
from comfysup.logs import FORMATS, setup_logging


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "work", parents=[common], help="run jobs on ComfyUI servers that are already running",
        description="Start one runner process per server. Each claims a job only while its server is free, "
                    "runs it to the end (retrying transient failures with backoff, dead-lettering permanent "
                    "ones) and stores its files. Runs until SIGTERM, or with --until-empty until no job is "
                    "left. Without --server, the [[servers]] of the config are used.")
    p.add_argument("--server", action="append", default=[], metavar="NAME=URL",
                   help="a server, e.g. gpu0=http://127.0.0.1:8188 (repeat for more)")
    p.add_argument("--until-empty", action="store_true", help="stop when no job is queued, waiting or running")
    p.add_argument("--attempts", type=int, help="attempts per job ([runner] attempts)")
    p.add_argument("--timeout-seconds", type=float, help="per-attempt timeout ([runner] timeout_seconds)")
    p.add_argument("--base-delay-ms", type=float, help="backoff base in ms ([runner] base_delay_seconds)")
    p.add_argument("--no-jitter", action="store_true", help="wait the whole backoff, not a random part")
    p.add_argument("--poll-ms", type=float, help="how often /history is read, in ms ([runner] poll_seconds)")
    p.add_argument("--lease-seconds", type=float, help="lease of a claim ([runner] lease_seconds)")
    p.add_argument("--log-format", choices=FORMATS, help="plain lines (default) or one JSON object per event "
                   "with job, slot and attempt ($COMFYSUP_LOG_FORMAT)")
    p.set_defaults(func=run)


def runner_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "runner.attempts": args.attempts,
        "runner.timeout_seconds": args.timeout_seconds,
        "runner.base_delay_seconds": None if args.base_delay_ms is None else args.base_delay_ms / 1000,
        "runner.jitter": False if args.no_jitter else None,
        "runner.poll_seconds": None if args.poll_ms is None else args.poll_ms / 1000,
        "runner.lease_seconds": args.lease_seconds,
    }


def load_with_overrides(args: argparse.Namespace) -> Config:
    overrides = runner_overrides(args)
    if args.lease_seconds is not None:
        # A shorter lease brings the heartbeat down with it, so the flag alone is never a config error.
        base = config_from(args)
        overrides["runner.heartbeat_seconds"] = min(base.runner.heartbeat_seconds, args.lease_seconds / 3)
    if args.base_delay_ms is not None:
        base = config_from(args)
        overrides["runner.max_delay_seconds"] = max(base.runner.max_delay_seconds, args.base_delay_ms / 1000)
    return config_from(args, overrides)


def parse_servers(values: list[str], config: Config) -> dict[str, str]:
    servers: dict[str, str] = {}
    for value in values:
        name, eq, url = value.partition("=")
        if not eq or not name or not url.startswith(("http://", "https://")):
            raise UsageError(f"--server {value!r}: expected NAME=URL, e.g. gpu0=http://127.0.0.1:8188")
        if name in servers:
            raise UsageError(f"--server {name} given twice")
        servers[name] = url.rstrip("/")
    if not servers:
        servers = {s.name: s.url for s in config.servers}
    if not servers:
        raise UsageError("no server: give --server NAME=URL, or [[servers]] in the config")
    return servers


def _child(config: Config, name: str, url: str, peers: dict[str, str], until_empty: bool,
           results: Any) -> None:
    from comfysup.runner.loop import Runner

    runner = Runner(config, name, url, peers=peers, until_empty=until_empty)
    runner.install_signals()
    counts = runner.run()
    results.put((name, dict(counts)))


def summary(counts: Counter[str]) -> str:
    parts = [f"{counts['done']} done", f"{counts['dead']} dead-lettered"]
    parts += [f"{counts[k]} {k}" for k in ("cancelled", "released", "lost") if counts[k]]
    return "summary: " + ", ".join(parts)


class Webhooks:
    """This process's deliverer: a thread started only after every runner has been forked (a fork while a
    thread holds a lock would leave the lock held forever in the child), with a last pass at the end so
    that ``--until-empty`` sends the webhooks of its last jobs before it returns."""

    def __init__(self, config: Config) -> None:
        from comfysup.observability.webhooks import Deliverer
        from comfysup.queue import open_queue

        self.config = config
        self.queue = open_queue(config, create=True)
        self.deliverer = Deliverer(self.queue, config.webhooks)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.deliverer.loop, args=(self.stop,), name="comfysup-webhooks",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        """Stop the loop, then keep delivering (retries included) for at most ``[webhooks] timeout_seconds``
        while deliveries are pending; whatever is left is sent by the next ``work`` or ``run``."""
        self.stop.set()
        self.thread.join()
        try:
            deadline = time.monotonic() + self.config.webhooks.timeout_seconds
            while True:
                self.deliverer.run_once()
                if not self.queue.pending_deliveries() or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        except ComfysupError as exc:
            logging.getLogger("comfysup").warning("webhooks: %s; undelivered ones are sent by the next run", exc)
        finally:
            self.queue.close()


def run(args: argparse.Namespace) -> int:
    config = load_with_overrides(args)
    servers = parse_servers(args.server, config)
    setup_logging(fmt=args.log_format)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    children = [ctx.Process(target=_child, name=f"comfysup-runner-{name}",
                            args=(config, name, url, servers, args.until_empty, results))
                for name, url in servers.items()]
    for child in children:
        child.start()
    webhooks = Webhooks(config)
    webhooks.start()

    def forward(signum: int, frame: object) -> None:
        for child in children:
            if child.pid and child.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # children get Ctrl-C from the terminal themselves
    totals: Counter[str] = Counter()
    failed = []
    for child in children:
        child.join()
        if child.exitcode != 0:
            failed.append(f"{child.name} exited with {child.exitcode}")
    for _ in range(len(children) - len(failed)):
        try:
            _name, counts = results.get(timeout=5)
        except queue.Empty:
            break
        totals.update(counts)
    webhooks.finish()
    for line in failed:
        logging.getLogger("comfysup").error(line)
    print(summary(totals), file=sys.stderr)
    return 1 if failed else 0
