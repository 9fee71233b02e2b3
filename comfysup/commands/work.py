"""``comfysup work``: runners against ComfyUI servers that are already running (nothing is launched)."""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from comfysup.commands._common import config_from
from comfysup.config import Config
from comfysup.errors import ComfysupError, UsageError
from comfysup.logs import FORMATS, setup_logging
from comfysup.observability.webhooks import Deliverer
from comfysup.queue import open_queue
from comfysup.queue.base import host_name
from comfysup.queue.watch import DEEP_CHECK_SECONDS, EXIT_DATABASE_REPLACED, QueueWatch
from comfysup.runner.loop import Runner
from comfysup.runner.objectstore import check_buckets
from comfysup.runner.options import RunnerHooks, RunnerOptions
from comfysup.runner.staging import StagingBound
from comfysup.runner.stuck import StuckChannel, out_of_service_reason
from comfysup.runner.uploader import UploadThread
from comfysup.slotstate import StateFile, work_state_path
from comfysup.storage.links import Links
from comfysup.supervisor.children import new_shared, problem_bytes, problem_of, waiting_peer
from comfysup.supervisor.lock import queue_lost
from comfysup.supervisor.manager import STOP_SIGNALS, ProcessManager
from comfysup.supervisor.policy import Action
from comfysup.supervisor.process import ProcessOps, describe_status
from comfysup.supervisor.stop import Step, StopPlan, Target

log = logging.getLogger("comfysup")

TICK_SECONDS = 1.0
"""The loop wakes at least this often (a runner's flags, the queue's file, work.json); signals and runners' exits
wake it at once. Each wake-up of this process costs CPU on cores its runners' servers may compute on: four a second
were 3-4 ms of CPU a second here (bench/real.py's realistic cell, 2 cores)."""
STOPPING_TICK_SECONDS = 0.25
"""While stopping: the stop plan's grace and kill come on time."""


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "work", parents=[common], help="run jobs on ComfyUI servers that are already running",
        description="Start one runner process per server. Each claims a job only while its server is free, "
                    "runs it to the end (retrying transient failures with backoff, dead-lettering permanent "
                    "ones) and stores its files. Runs until SIGTERM or Ctrl-C (running jobs get [runner] "
                    "grace_seconds; a second one stops at once), or with --until-empty until no job is left. "
                    "A runner that dies has its claims released at once. Without --server, the [[servers]] "
                    "of the config are used.")
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


def own_output_dirs(config: Config, servers: dict[str, str]) -> dict[str, Path]:
    """The [[servers]] output_dir of each server this command runs, when it runs that entry's server (a
    ``--server NAME=URL`` of another URL is not the folder's server)."""
    urls = {s.name: s.url for s in config.servers}
    return {name: folder for name, folder in config.server_output_dirs().items() if servers.get(name) == urls[name]}


def _child(config: Config, name: str, url: str, peers: dict[str, str], until_empty: bool, results: Any,
           token: str, shared: Any, others: list[Any]) -> int:
    """In a forked runner process (its own process group, default signals, dying with ``work``). ``others``:
    the other runners' shared blocks (no job is queued ahead while one of them waits for work)."""
    def report_stuck(prompt_id: str) -> None:
        shared.stuck = prompt_id.encode()[:39]

    # Servers that are not ours are never restarted: the runner takes its server out of service itself.
    stuck = StuckChannel(restarts=False, report=report_stuck, pending=lambda: bool(shared.stuck))
    def on_waiting(waiting: bool) -> None:
        shared.waiting = int(waiting)

    def on_problem(reason: str) -> None:
        shared.problem = problem_bytes(reason)

    options = RunnerOptions(peers=peers, until_empty=until_empty, owner_token=token,
                            output_dirs=own_output_dirs(config, peers))
    hooks = RunnerHooks(stuck=stuck, on_waiting=on_waiting, peer_waiting=lambda: waiting_peer(others),
                        on_problem=on_problem)
    runner = Runner(config, name, url, options, hooks)
    runner.install_signals()
    counts = runner.run()
    results.put((name, dict(counts)))
    results.close()
    results.join_thread()  # the process ends with os._exit: flush the queue's feeder first
    return 0


def summary(counts: Counter[str]) -> str:
    parts = [f"{counts['done']} done", f"{counts['dead']} dead-lettered"]
    parts += [f"{counts[k]} {k}" for k in ("cancelled", "released", "lost") if counts[k]]
    return "summary: " + ", ".join(parts)


class Webhooks:
    """This process's deliverer: a thread started only after every runner has been forked (a fork while a
    thread holds a lock would leave the lock held forever in the child), with a last pass at the end so
    that ``--until-empty`` sends the webhooks of its last jobs before it returns."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.queue = open_queue(config, create=True)
        self.deliverer = Deliverer(self.queue, config.webhooks, links=Links(config.store))
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
                if not self.queue.deliveries.pending_deliveries() or time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        except ComfysupError as exc:
            log.warning("webhooks: %s; undelivered ones are sent by the next run", exc)
        finally:
            self.queue.close()


class Work:
    """One runner process per server, through the supervisor's process manager: a runner's claims are
    released the moment it dies, the runners die with this process, and SIGTERM or Ctrl-C stops them
    with their grace (SIGKILLed after it), a second one at once. Runners are not restarted."""

    def __init__(self, config: Config, servers: dict[str, str], until_empty: bool,
                 ops: ProcessOps | None = None) -> None:
        self.config = config
        self.servers = servers
        self.until_empty = until_empty
        self.manager = ProcessManager(ops or ProcessOps(), who="comfysup work")
        self.plan = StopPlan()
        self.failed: list[str] = []
        self.queue: Any = None
        """For releasing the claims of runners that died (opened after the forks, like every connection)."""
        self.watch: QueueWatch | None = None
        """Its file (set with ``queue``): deleted, replaced or corrupt, the runners are killed and work exits 75."""
        self.shared = {name: new_shared() for name in servers}
        """Each runner's shared block: its ``stuck`` field says that its server is out of service, ``waiting``
        that it waits for work (about to ask, at first)."""
        for shared in self.shared.values():
            shared.may_claim = shared.waiting = 1  # nothing here forbids a claim; each is about to ask
        self.staging = StagingBound(config)
        """Full while this machine's jobs waiting for the bucket hold [store] staging_max_gb: no runner claims."""
        self.state_path = work_state_path(config)
        self.state_file = StateFile(self.state_path)
        self.said: dict[str, str | None] = {}

    def start(self, results: Any) -> None:
        self.manager.install_signals()
        for name, url in self.servers.items():
            self.manager.fork_runner(name, lambda token, name=name, url=url: _child(
                self.config, name, url, self.servers, self.until_empty, results, token, self.shared[name],
                [s for n, s in self.shared.items() if n != name]))

    def loop(self) -> None:
        """Until every runner has ended: signals, exits, then the stop plan."""
        try:
            while self.manager.runners:
                self.tick(time.monotonic())
                if self.manager.runners:
                    self.manager.wait(STOPPING_TICK_SECONDS if self.plan.stopping else TICK_SECONDS)
        finally:
            self.manager.restore_signals()
            self.write_state(final=True)

    def slots(self, *, final: bool = False) -> list[dict[str, Any]]:
        """Each server as ``comfysup status`` and ``health`` show it (state ``out_of_service`` while a
        prompt is stuck in it)."""
        pids = {r.name: r.pid for r in self.manager.runners.values()}
        rows = []
        for name, url in self.servers.items():
            prompt = bytes(self.shared[name].stuck).decode(errors="replace")
            problem = problem_of(self.shared[name])
            reason = out_of_service_reason(prompt) if prompt else problem
            rows.append({"name": name, "device": "external", "url": url, "runner_pid": pids.get(name),
                         "state": "stopped" if final else "out_of_service" if reason else "external",
                         "reason": reason, "out_of_service": reason, "problem": problem})
        return rows

    def write_state(self, *, final: bool = False) -> None:
        """``work.json`` beside the queue, atomically, when it changed (comfysup.slotstate.StateFile: looked at every
        tick); and a log line when a server's service changes."""
        slots = self.slots(final=final)
        for slot in slots:
            # A stuck prompt is said here; a server whose answers cannot be read, by its runner (already said).
            stuck = slot["reason"] if slot["reason"] != slot["problem"] else None
            if not final and self.said.get(slot["name"]) != stuck:
                if stuck:
                    log.error("%s: %s; no job goes to it until its queue is empty", slot["name"], stuck)
                elif self.said.get(slot["name"]):
                    log.info("%s: in service again", slot["name"])
                self.said[slot["name"]] = stuck
        out = sum(1 for s in slots if s["reason"])
        snapshot = {"pid": os.getpid(), "host": host_name(), "state": "stopped" if final else "running",
                    "updated_at": time.time(), "slots": slots, "staging": self.staging.snapshot(),
                    "summary": f"{len(slots)} server(s), {out} out of service" if out else f"{len(slots)} server(s)"}
        try:
            try:
                self.state_file.write(snapshot, force=final)
            except FileNotFoundError:  # no folder (yet: a queue on PostgreSQL names no file there; or removed)
                self.state_path.parent.mkdir(parents=True, exist_ok=True)
                self.state_file.write(snapshot, force=True)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_path, exc.strerror)

    def tick(self, now: float) -> None:
        grace = self.config.runner.grace_seconds
        for sig in self.manager.pop_signals():
            if sig not in STOP_SIGNALS:
                continue
            name = signal.Signals(sig).name
            if not self.plan.stopping:
                log.info("%s: stopping; running jobs get %g s to finish, then are interrupted and released",
                         name, grace)
                self._carry_out(self.plan.begin(now, grace))
            elif not self.plan.cold:
                log.info("%s again: cold stop, killing the runners now", name)
                self._carry_out(self.plan.cold_stop(now, grace))
        for pid, status in self.manager.reap():
            how = describe_status(status)
            self._check_queue(now, status, pid)
            kept = None if self.watch is not None and self.watch.lost else self.queue  # none released in a lost file
            runner = self.manager.runner_exited(pid, how, kept, stopping=self.plan.stopping)
            if runner is not None:  # gone, and never started again here: its peers must not leave work for it
                self.shared[runner.name].waiting = self.shared[runner.name].may_claim = 0
            if runner is not None and status != 0:
                self.failed.append(f"comfysup-runner-{runner.name} exited with {runner.kill_reason or how}")
        self._check_queue(now)
        full = self.staging.look(self.queue, now)
        for runner in self.manager.runners.values():  # a runner gone keeps its may_claim of 0
            self.shared[runner.name].may_claim = int(not full)
        if self.plan.stopping:
            self._carry_out(self.plan.step(now, runners=bool(self.manager.runners), servers=False, monitor=False))
        self.write_state()

    def _check_queue(self, now: float, status: int | None = None, pid: int = 0) -> None:
        """Each tick and at each runner's exit: the queue's file lost (seen here, or by a runner that exited with
        EXIT_DATABASE_REPLACED), every write of the runners goes to a file nobody reads: they are killed now."""
        if self.plan.cold or self.watch is None:
            return
        runner = self.manager.runners.get(pid)
        why = queue_lost(self.watch, status, f"runner of {runner.name if runner else pid}")
        if why is not None:
            self.watch.lost = self.watch.lost or why
            log.error("%s; the runners are stopped", why)
            self._carry_out(self.plan.cold_stop(now, self.config.runner.grace_seconds))

    def _carry_out(self, actions: Step) -> None:
        for target, action in actions:
            if target is not Target.RUNNERS:
                continue  # work launches no server, and its webhooks run in a thread
            if action is Action.TERM:
                self.manager.signal_runners(signal.SIGTERM)
            else:
                why = ("the queue's file is lost" if self.watch and self.watch.lost else "cold stop of comfysup work"
                       if self.plan.cold else "did not stop within the grace")
                self.manager.signal_runners(signal.SIGKILL, reason=why)


def run(args: argparse.Namespace) -> int:
    config = load_with_overrides(args)
    servers = parse_servers(args.server, config)
    setup_logging(fmt=args.log_format)
    for warning in check_buckets(config):  # wrong credentials or no bucket: refused here, not per job
        log.warning("%s", warning)
    results = multiprocessing.get_context("fork").Queue()
    # The queue's file and schema are made here, before the runners fork, and the connection closed (none
    # crosses a fork): made by a runner and this process at once, the loser's WAL switch met the winner's
    # lock and `work` exited "database is locked" on a fresh queue.
    open_queue(config, create=True).close()
    work = Work(config, servers, args.until_empty)
    work.start(results)
    work.queue = open_queue(config, create=True)
    work.watch = QueueWatch(work.queue, every_seconds=config.runner.heartbeat_seconds, deep_seconds=DEEP_CHECK_SECONDS)
    webhooks = Webhooks(config)
    webhooks.start()
    uploads = UploadThread(config)  # the upload outbox ([store] url): a thread, as the webhooks
    uploads.start()
    try:
        work.loop()
    finally:
        work.queue.close()
        uploads.finish()
    totals: Counter[str] = Counter()
    for _ in range(len(servers) - len(work.failed)):
        try:
            _name, counts = results.get(timeout=5)
        except queue.Empty:
            break
        totals.update(counts)
    if work.watch.lost is None:
        webhooks.finish()
    for line in work.failed:
        log.error(line)
    print(summary(totals), file=sys.stderr)
    return EXIT_DATABASE_REPLACED if work.watch.lost else 1 if work.failed else 0
