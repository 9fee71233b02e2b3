"""One function per row of the fault table, sized by its caller.

Each takes a fresh folder, the run's seed and its sizes; injects its faults into a real ``comfysup run``
(or ``comfysup submit``) while jobs run; drains; and returns the checker's :class:`Report` with the
row's own figures. The fast tests call them with small sizes, ``bench/chaos.py`` with the full ones.
A scenario never asserts the promise itself: the checker's verdict (``report.ok``) does, so the same
function is a test and a measurement. It asserts only what its own row expects beyond the checker
(a slot still running, kills that landed where they were aimed, …).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import math
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from hypothesis import HealthCheck, given, settings, strategies
from hypothesis import seed as fixed_seed
from supervisor_support import REPO, TRIVIAL, running_prompts, wait_for

from chaos.checker import Report, Submission
from chaos.harness import MIN_LIFE_SECONDS, ChaosRun
from comfysup.supervisor.stop import KILL_WAIT_SECONDS

SLOTS = ("cpu0", "cpu1")
INPUT_SHARE = 0.4
"""The share of K1's, K2's and K3's jobs that bring an input image: uploaded by the runner before
its POST, so kills land around uploads too, and each output is checked against its input."""


def _top_up(h: ChaosRun, batch: int) -> None:
    """Keep work in the queue while faults remain to be injected, so every fault lands on a busy system."""
    if h.active() < 4:
        h.submit(h.jobs_for(batch))


def _kill_loop(h: ChaosRun, count: int, pick: Callable[[dict[str, Any]], int | None], kind: str,
               spread_seconds: float, seconds: float) -> dict[str, int]:
    """Kill a process of each slot at a random moment after it has lived MIN_LIFE_SECONDS, ``count`` times
    in all, topping up the queue as needed. ``pick`` returns the pid to kill now from a slot (None: not
    now). Returns kills, and how many landed while the slot's runner held a job."""
    kills = holding = 0
    due: dict[int, float] = {}
    done_pids: set[int] = set()
    deadline = time.monotonic() + seconds
    while kills < count and time.monotonic() < deadline:
        _top_up(h, 10)
        for slot in h.slots():
            pid = pick(slot)
            # supervisor.json may name a killed process a moment longer: each pid is killed once.
            if pid is None or pid in done_pids or h.age(pid) < MIN_LIFE_SECONDS:
                continue
            at = due.setdefault(pid, time.monotonic() + h.rng.uniform(0, spread_seconds))
            if time.monotonic() < at:
                continue
            done_pids.add(pid)
            h.kill(kind, pid, job=slot.get("job"), slot=slot["name"])
            del due[pid]
            kills += 1
            holding += bool(slot.get("job"))
            if kills >= count:
                break
        time.sleep(0.01)
    return {"kills": kills, "kills_holding_a_job": holding}


def _kill_after_files(h: ChaosRun, count: int, seconds: float) -> dict[str, int]:
    """Kill a slot's server the moment a complete file of the job its runner holds appears in the server's
    output folder (``output/comfysup/<job id>/``), ``count`` times; each server pid once."""
    kills = 0
    done_pids: set[int] = set()
    deadline = time.monotonic() + seconds
    while kills < count and time.monotonic() < deadline:
        _top_up(h, 10)
        for slot in h.slots():
            pid, job = slot.get("pid"), slot.get("job")
            if (slot["state"] != "running" or not pid or not job or pid in done_pids
                    or h.age(pid) < MIN_LIFE_SECONDS):
                continue
            if _file_landed(h, slot["name"], job):
                done_pids.add(pid)
                h.kill("server_kill", pid, job=job, slot=slot["name"], after="file")
                kills += 1
                if kills >= count:
                    break
        time.sleep(0.002)
    return {"kills_after_a_file": kills}


def _file_landed(h: ChaosRun, slot: str, job: str) -> bool:
    """A complete file of ``job`` is in its folder of the slot's server's output folder."""
    from chaos.checker import complete_png

    folder = h.config.resolve(h.config.comfyui.base_directory) / slot / "output" / "comfysup" / job
    try:
        return any(p.suffix == ".png" and complete_png(p.read_bytes()) for p in folder.iterdir())
    except OSError:
        return False


class _Tail:
    """Follows fake_comfy's execution log from another thread and calls back on each new event."""

    def __init__(self, path: Path, on_event: Callable[[dict[str, Any]], None]) -> None:
        self.path = path
        self.on_event = on_event
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> _Tail:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)

    def _run(self) -> None:
        offset = 0
        pending = b""
        while not self.stop.is_set():
            try:
                with open(self.path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except FileNotFoundError:
                chunk = b""
            offset += len(chunk)
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                with contextlib.suppress(ValueError):
                    self.on_event(json.loads(line))
            if not chunk:
                time.sleep(0.001)


# -- K1: kill -9 a random runner at random moments ----------------------------------------------------


def k1_runner_kills(tmp: Path, seed: int, *, jobs: int, kills: int, aimed: int = 0, node_ms: float = 60.0,
                    spread_seconds: float = 0.6, input_share: float = INPUT_SHARE) -> Report:
    """A runner killed is released at once and the job re-claimed; its prompt, still on the server, is
    followed or adopted, never run again: every job done once. ``kills`` land at random moments;
    ``aimed`` more land right after a POST /prompt was answered, before the runner could record where its
    prompt runs (the moment that once let the other slot post the job a second time)."""
    h = ChaosRun(tmp, "K1", seed, node_ms=node_ms, input_share=input_share)
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)
        runners: dict[str, int] = {}
        port_slot = {int(s["url"].rsplit(":", 1)[1]): s["name"] for s in h.slots()}
        aimer = random.Random(f"{seed}/K1/aimed")  # its own: the tail runs in another thread
        left = [aimed]
        killed: set[int] = set()

        def after_post(event: dict[str, Any]) -> None:
            if event.get("event") != "post" or event.get("status") != 200 or left[0] <= 0:
                return
            slot = port_slot.get(event["port"], "")
            pid = runners.get(slot)
            if pid and pid not in killed and h.age(pid) >= MIN_LIFE_SECONDS and aimer.random() < 0.5:
                left[0] -= 1
                killed.add(pid)
                h.kill("runner_kill", pid, job=event["prompt_id"], slot=slot, after="post")

        def pick(slot: dict[str, Any]) -> int | None:
            """The slot's runner, unless it was killed already (supervisor.json may name it a moment longer)."""
            pid = slot.get("runner_pid")
            if not pid or pid in killed or slot["runner_state"] != "running":
                return None
            runners[slot["name"]] = pid
            return pid

        with _Tail(h.exec_log, after_post):
            figures = _kill_loop(h, kills, pick, "runner_kill", spread_seconds, seconds=3600)
            deadline = time.monotonic() + 60 + aimed * 2
            while left[0] > 0 and time.monotonic() < deadline:
                _top_up(h, 10)
                for slot in h.slots():
                    pick(slot)
                time.sleep(0.01)
        report = h.finish(proc, drain_seconds=120 + jobs * 0.2)
        report.figures.update(figures)
        report.figures["kills_after_post"] = sum(1 for f in h.faults.faults()
                                                 if (f.detail or {}).get("after") == "post")
        report.figures["released_at_once"] = _released_at_once(h)
        return report
    finally:
        h.cleanup()


def _released_at_once(h: ChaosRun) -> str:
    """How long after a runner kill its claim was released (the supervisor reaps the pid; the lease is
    10 s): the slowest of them, and how many were released."""
    kills = {f.pids[0]: f.at for f in h.faults.faults() if f.kind == "runner_kill"}
    delays = []
    for owner, ended in h.sql("SELECT owner, ended_at FROM attempts WHERE outcome = 'released'"):
        pid = int(owner.split("/")[1])
        if pid in kills and ended is not None:
            delays.append(ended - kills[pid])
    return f"{len(delays)} released, slowest {max(delays):.2f} s after the kill" if delays else "none held a job"


# -- K2: kill -9 the supervisor, then start it again -----------------------------------------------------


def k2_supervisor_kills(tmp: Path, seed: int, *, kills: int, jobs_per_kill: int = 6, node_ms: float = 40.0,
                        input_share: float = INPUT_SHARE) -> Report:
    """Its servers and runners die with it (no stray process); a new supervisor releases their claims and
    finishes every job once. The queue is topped up so that every kill lands on a working system."""
    h = ChaosRun(tmp, "K2", seed, node_ms=node_ms, input_share=input_share)
    strays_left = 0
    try:
        h.submit(h.jobs_for(jobs_per_kill * 2))
        for _ in range(kills):
            if h.active() < jobs_per_kill:
                h.submit(h.jobs_for(jobs_per_kill))
            proc = h.start()
            h.wait_ready(proc, seconds=30)
            time.sleep(h.rng.uniform(0.0, 1.5))  # the random moment of the kill, not a wait for anything
            h.kill_supervisor(proc)
            try:
                wait_for(h.all_gone, 5, "the supervisor's children to die with it")
            except AssertionError:
                strays_left += 1
                for pid in h.strays():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        proc = h.start()
        report = h.finish(proc, drain_seconds=300)
        report.figures.update(kills=kills, strays=strays_left)
        if strays_left:
            report.row_failures.append(f"{strays_left} supervisor kill(s) left processes behind for more than 5 s")
        return report
    finally:
        h.cleanup()


# -- K3: kill -9 a ComfyUI server mid-prompt ---------------------------------------------------------------


def k3_server_kills(tmp: Path, seed: int, *, jobs: int, kills: int, file_kills: int = 0, node_ms: float = 60.0,
                    history_delay_ms: float = 150.0, input_share: float = INPUT_SHARE) -> Report:
    """The server is restarted; the job it ran is re-run (a re-execution matched to the kill) and done
    once. A kill is aimed at a prompt the server is executing, checked on its /queue just before.

    Then ``file_kills`` kills land just after a job's file is written: the server's output folder is watched
    for a complete file of the job its runner holds, and the server is killed at once, before its history
    is read (ComfyUI writes it a moment after the file; ``history_delay_ms`` widens that moment, as the
    ~20 ms measured on a real ComfyUI cannot be hit reliably from outside). The job is adopted from its
    file, never run again: the checker counts any execution after a completed one as a failure."""
    h = ChaosRun(tmp, "K3", seed, node_ms=node_ms, extra_args=("--history-delay-ms", str(history_delay_ms)),
                 input_share=input_share)
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)

        def executing(slot: dict[str, Any]) -> int | None:
            if slot["state"] != "running" or not slot.get("job") or not slot.get("pid"):
                return None
            if _file_landed(h, slot["name"], slot["job"]):
                return None  # mid-prompt means before its file: later kills are the file_kills below
            return slot["pid"] if slot["job"] in running_prompts(slot["url"]) else None

        figures = _kill_loop(h, kills, executing, "server_kill", 0.15, seconds=3600)
        figures.update(_kill_after_files(h, file_kills, seconds=60))
        report = h.finish(proc, drain_seconds=120 + jobs * 0.2)
        report.figures.update(figures)
        report.figures["adopted_from_files"] = h.log().count("(adopted from its files in the server's output folder)")
        report.figures["server_restarts"] = sum(s["restarts"] for s in (h.state() or {}).get("slots", []))
        report.figures["failed_slots"] = [s["name"] for s in (h.state() or {}).get("slots", [])
                                          if s["state"] == "failed"]
        return report
    finally:
        h.cleanup()


# -- K4: kill -9 comfysup submit mid-file ----------------------------------------------------------------


def k4_submit_kills(tmp: Path, seed: int, *, kills: int, lines: int = 2000) -> Report:
    """``comfysup submit`` (a subprocess, as a person runs it) killed with SIGKILL at random moments spread
    over a calibrated full run (start-up, validation, insert, commit), each time with a new file, into
    one queue that keeps growing: each file is in the queue whole or not at all, and the database passes
    its integrity check. Half the killed files are submitted again, as a person would: they go in whole.
    tests/acceptance/test_submit_kill.py kills a 10,000-line file into fresh queues; this is the same kill into a
    live queue, many times, with the checker's accounting."""
    from cli_support import kill_submit as _kill  # the same kill-and-check as the single-queue test

    h = ChaosRun(tmp, "K4", seed)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
        env["PYTHONPATH"] = str(REPO)

        def submit(path: Path) -> subprocess.Popen[bytes]:
            return subprocess.Popen([sys.executable, "-m", "comfysup", "submit", "--config", str(h.config_path),
                                     str(path)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        # Two calibration runs, the second timed: the first also makes the queue and caches the bytecode, so the
        # kills that followed it fell past the end of every later, faster submit (6 of 6 in one run).
        for _ in range(2):
            calibration = h.jobs_for(lines)
            path = h.write_jobs(calibration)
            started = time.monotonic()
            assert submit(path).wait(120) == 0
            full = time.monotonic() - started
            h.submissions.append(Submission(path, tuple(j["id"] for j in calibration), "accepted"))
        killed = finished = resubmitted = after_commit = 0
        for _ in range(kills):
            batch = h.jobs_for(lines)
            path = h.write_jobs(batch)
            ids = tuple(j["id"] for j in batch)
            child = submit(path)
            time.sleep(h.rng.uniform(0.0, full * 1.05))  # the random moment of the kill, not a wait
            h.faults.record("submit_kill", pids=(child.pid,))
            if _kill(child):
                killed += 1
                h.submissions.append(Submission(path, ids, "killed"))
                after_commit += bool(h.sql("SELECT 1 FROM jobs WHERE id = ?", (ids[0],)))
                if h.rng.random() < 0.5:  # a person submits the file again
                    again = submit(path)
                    assert again.wait(120) == 0, again.communicate()[1].decode()
                    h.submissions.append(Submission(path, ids, "accepted"))
                    resubmitted += 1
            else:
                finished += 1
                h.submissions.append(Submission(path, ids, "accepted"))
        report = h.finish(None)
        report.figures.update(kills=killed, finished_before_the_kill=finished, resubmitted=resubmitted,
                              killed_after_the_commit=after_commit, lines_per_file=lines,
                              full_submit_seconds=round(full, 2), rows=h.sql("SELECT count(*) FROM jobs")[0][0])
        return report
    finally:
        h.cleanup()


# -- K5: kill -9 a runner between ComfyUI's success and the done record ---------------------------------


def k5_kill_after_success(tmp: Path, seed: int, *, kills: int, jobs: int, node_ms: float = 20.0) -> Report:
    """The moment the fake logs a job's success, its runner is killed: before its done record, most of the
    time. The next attempt finds the run in /history and adopts it: executed once, no re-run. A runner is
    killed only once it has lived longer than a quick failure (the supervisor would rightly mark a slot
    whose runner keeps dying at birth as failed), so about half the successes are aimed at."""
    h = ChaosRun(tmp, "K5", seed, node_ms=node_ms)
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)
        port_slot = {int(s["url"].rsplit(":", 1)[1]): s["name"] for s in h.slots()}
        runners: dict[str, int] = {}
        killed: set[int] = set()
        aimer = random.Random(f"{seed}/K5/aimed")  # its own: the tail runs in another thread
        left = [kills]

        def on_event(event: dict[str, Any]) -> None:
            if event.get("event") != "end" or event.get("outcome") != "success" or left[0] <= 0:
                return
            slot = port_slot.get(event["port"], "")
            pid = runners.get(slot)
            if pid and h.age(pid) >= MIN_LIFE_SECONDS and aimer.random() < 0.5:
                left[0] -= 1
                runners.pop(slot, None)
                killed.add(pid)  # never the same runner twice (supervisor.json may name it a moment longer)
                h.kill("runner_kill", pid, job=event["prompt_id"], slot=slot, after="success")

        with _Tail(h.exec_log, on_event):
            deadline = time.monotonic() + 60 + kills * 3
            while left[0] > 0 and time.monotonic() < deadline:
                _top_up(h, 10)
                for slot in h.slots():
                    pid = slot.get("runner_pid")
                    if pid and slot["runner_state"] == "running" and pid not in killed:
                        runners[slot["name"]] = pid
                time.sleep(0.01)
        report = h.finish(proc)
        in_window = 0
        kills_done = [f for f in h.faults.faults() if f.kind == "runner_kill"]
        for fault in kills_done:
            rows = h.sql("SELECT outcome FROM attempts WHERE job_id = ? AND owner LIKE ?",
                         (fault.job, f"%/{fault.pids[0]}/%"))
            in_window += any(r[0] == "released" for r in rows)  # the kill came before the done record
        adopted = h.log().count("(adopted from /history)")
        report.figures.update(kills=len(kills_done), kills_before_the_done_record=in_window, adopted=adopted)
        if len(kills_done) < kills:
            report.row_failures.append(f"only {len(kills_done)} of {kills} kills landed in time")
        return report
    finally:
        h.cleanup()


# -- Z1: SIGSTOP a runner past its lease, then SIGCONT ---------------------------------------------------


@dataclass
class _Frozen:
    """A runner frozen by Z1: when, for how long, and when it was seen dead."""

    pid: int
    job: str
    stopped_at: float
    seconds: float
    dead_at: float | None = None


def z1_stopped_runners(tmp: Path, seed: int, *, stops: int, jobs: int, node_ms: float = 60.0,
                       at_once: int = 2) -> Report:
    """A runner frozen with SIGSTOP while it holds a job, for longer than its lease (2 s), then continued
    with SIGCONT; up to ``at_once`` slots' runners are frozen at a time. The supervisor sees a frozen runner
    silent past ``runner_timeout_seconds``, kills it, and only then releases its job: the next attempt
    starts after the runner was dead, and the frozen runner writes nothing after it was frozen."""
    runner = {"lease_seconds": 2.0, "heartbeat_seconds": 0.2, "http_timeout_seconds": 0.8}
    supervisor = {"runner_timeout_seconds": 1.0}
    h = ChaosRun(tmp, "Z1", seed, node_ms=node_ms, runner=runner, supervisor=supervisor)
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)
        done = 0
        frozen: dict[str, _Frozen] = {}
        used: set[int] = set()
        handed_on_early = []
        deadline = time.monotonic() + 60 + stops * 10
        while (done < stops or frozen) and time.monotonic() < deadline:
            _top_up(h, 6)
            for slot in h.slots():
                name, pid = slot["name"], slot.get("runner_pid")
                f = frozen.get(name)
                if f is None:
                    wanted = done + len(frozen) < stops and len(frozen) < at_once
                    if (wanted and pid and pid not in used and slot.get("job") and slot["runner_state"] == "running"
                            and h.age(pid) >= MIN_LIFE_SECONDS):
                        used.add(pid)  # supervisor.json may still name it after it was killed and reaped
                        try:
                            os.kill(pid, signal.SIGSTOP)
                        except ProcessLookupError:
                            continue  # it ended between supervisor.json and now
                        # Past the 2 s lease: the fault lasts this long whatever happens meanwhile.
                        frozen[name] = _Frozen(pid, slot["job"], time.time(), h.rng.uniform(2.2, 3.0))
                    continue
                if f.dead_at is None and _dead(f.pid):
                    f.dead_at = time.time()  # the supervisor killed it (within 10 ms of this)
                if time.time() - f.stopped_at < f.seconds:
                    continue
                with contextlib.suppress(ProcessLookupError):
                    os.kill(f.pid, signal.SIGCONT)
                dead_at = f.dead_at or time.time()
                h.faults.record("runner_stop", pids=(f.pid,), at=f.stopped_at, until=dead_at, job=f.job,
                                killed_by_supervisor=f.dead_at is not None)
                # The job may be handed on only once the frozen runner was dead.
                for started, owner in h.sql("SELECT started_at, owner FROM attempts WHERE job_id = ? AND "
                                            "started_at > ? ORDER BY rowid", (f.job, f.stopped_at)):
                    if started < dead_at - 0.05:  # dead_at is polled every 10 ms
                        handed_on_early.append(f"{f.job} to {owner} at {started:.3f} while {f.pid} was frozen "
                                               f"(dead at {dead_at:.3f})")
                del frozen[name]
                done += 1
            time.sleep(0.01)
        report = h.finish(proc, drain_seconds=120 + jobs * 0.3)
        stale = 0
        for fault in h.faults.faults():
            # What the frozen runner recorded of its job after it was frozen: only the supervisor's release.
            stale += h.sql("SELECT count(*) FROM attempts WHERE owner LIKE ? AND job_id = ? AND ended_at > ? "
                           "AND outcome != 'released'", (f"%/{fault.pids[0]}/%", fault.job, fault.at))[0][0]
        report.figures.update(stops=done, killed_by_supervisor=sum(1 for f in h.faults.faults()
                                                                   if (f.detail or {}).get("killed_by_supervisor")),
                              stale_commits=stale)
        report.overlapping_claims += handed_on_early
        if stale:
            report.row_failures.append(f"{stale} attempt(s) recorded by a frozen runner after it was frozen")
        if done < stops:
            report.row_failures.append(f"only {done} of {stops} stops done in time")
        return report
    finally:
        h.cleanup()


def _dead(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# -- Z2 and D1: the database locked by another process ------------------------------------------------------


class _Locker:
    """Another process's write lock on the queue (BEGIN IMMEDIATE, held), as a stuck tool would hold it."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=60, isolation_level=None)

    def hold(self, seconds: float) -> tuple[float, float]:
        self.conn.execute("BEGIN IMMEDIATE")
        start = time.time()
        time.sleep(seconds)  # the fault itself: the lock is held this long
        self.conn.execute("ROLLBACK")
        return start, time.time()

    def close(self) -> None:
        self.conn.close()


def z2_lock_past_the_lease(tmp: Path, seed: int, *, locks: int, jobs: int, node_ms: float = 500.0) -> Report:
    """The write lock held past the lease (and past the busy timeout): heartbeats fail, the attempt
    interrupts its prompt and stops without writing; when the lock goes, leases expire and the jobs come
    back. Nothing lost; each re-run matched to the lock."""
    runner = {"lease_seconds": 4.0, "heartbeat_seconds": 0.3, "http_timeout_seconds": 1.0}
    supervisor = {"runner_timeout_seconds": 2.5}
    h = ChaosRun(tmp, "Z2", seed, node_ms=node_ms, runner=runner, supervisor=supervisor,
                 queue={"busy_timeout_seconds": 1.0})
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)
        locker = _Locker(h.queue_path)
        held = 0
        try:
            while held < locks:
                _top_up(h, 6)
                wait_for(lambda: any(s.get("job") for s in h.slots()), 30, "a job to run", h.describe)
                start, end = locker.hold(h.rng.uniform(5.0, 7.0))
                h.faults.record("db_lock", at=start, until=end)
                held += 1
                time.sleep(h.rng.uniform(0.5, 2.0))  # the gap between two locks
        finally:
            locker.close()
        report = h.finish(proc, drain_seconds=120 + jobs * 0.3)
        log = h.log()
        report.figures.update(locks=held, attempts_stopped=log.count("stopped without writing"),
                              runner_restarts=sum(s["runner_restarts"] for s in (h.state() or {}).get("slots", [])))
        return report
    finally:
        h.cleanup()


def d1_short_locks(tmp: Path, seed: int, *, locks: int, jobs: int, node_ms: float = 20.0,
                   max_lock_seconds: float = 4.0) -> Report:
    """The write lock held 0.1–4 s at random (log-uniform), over and over: every process waits within its
    busy timeout and goes on. No crash (no runner or server restart), nothing lost, nothing re-run."""
    runner = {"lease_seconds": 15.0, "heartbeat_seconds": 0.5}
    supervisor = {"runner_timeout_seconds": 8.0}
    h = ChaosRun(tmp, "D1", seed, node_ms=node_ms, runner=runner, supervisor=supervisor,
                 queue={"busy_timeout_seconds": 10.0})
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)
        locker = _Locker(h.queue_path)
        held = 0
        total = 0.0
        try:
            while held < locks:
                _top_up(h, max(4, jobs // 4))
                seconds = math.exp(h.rng.uniform(math.log(0.1), math.log(max_lock_seconds)))
                start, end = locker.hold(seconds)
                h.faults.record("db_lock_short", at=start, until=end)
                held += 1
                total += end - start
                time.sleep(h.rng.uniform(0.05, 0.3))
        finally:
            locker.close()
        report = h.finish(proc, drain_seconds=300)
        slots = (h.state() or {}).get("slots", [])
        restarts = sum(s["runner_restarts"] + s["restarts"] for s in slots)
        report.figures.update(locks=held, locked_seconds=round(total, 1), restarts=restarts,
                              attempts_stopped=h.log().count("stopped without writing"))
        if restarts:
            report.row_failures.append(f"{restarts} process restart(s) during short locks: something crashed")
        if report.re_executions:
            report.row_failures.append(f"re-executions during short locks: {dict(report.re_executions)}")
        return report
    finally:
        h.cleanup()


# -- D2: a long reader holding a read transaction during many jobs ------------------------------------


def _wal_bytes(h: ChaosRun) -> int:
    try:
        return h.queue_path.with_name(h.queue_path.name + "-wal").stat().st_size
    except FileNotFoundError:
        return 0


def d2_long_reader(tmp: Path, seed: int, *, jobs: int, node_ms: float = 1.0) -> Report:
    """Three phases of one run. 1: comfysup's own readers (status, results) loop while a third of the jobs
    run: they read in short transactions, so the WAL stays within its checkpoint size. 2: another process
    holds one read transaction open over the next third: no checkpoint may pass its snapshot, so the WAL
    grows with every write (SQLite's rule, measured here per job). 3: the reader lets go; the next
    checkpoints reset the WAL and ``journal_size_limit`` (64 MiB) bounds the file again."""
    h = ChaosRun(tmp, "D2", seed, node_ms=node_ms)
    try:
        third = max(1, jobs // 3)
        h.submit(h.jobs_for(third))
        proc = h.start()
        h.wait_ready(proc)
        peaks = {"own readers": 0, "long reader": 0, "after": 0}
        phase = "own readers"
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                peaks[phase] = max(peaks[phase], _wal_bytes(h))
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            while h.active():
                h.command("status")  # comfysup's own readers, as a person polling would run them
                h.command("results", "--csv")
            reader = sqlite3.connect(h.queue_path, isolation_level=None)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM jobs").fetchone()  # the snapshot is taken here
            phase = "long reader"
            held_at = time.time()
            h.submit(h.jobs_for(third))
            h.drain(proc, 120 + third * 0.2)
            grown = _wal_bytes(h)
            reader.execute("COMMIT")
            reader.close()
            h.faults.record("long_reader", at=held_at, until=time.time())
            phase = "after"
            h.submit(h.jobs_for(jobs - 2 * third))
            h.drain(proc, 120 + third * 0.2)
            settle = time.monotonic() + 40
            while _wal_bytes(h) > 64 * 2**20 and time.monotonic() < settle:
                h.submit(h.jobs_for(2))  # a checkpoint runs after commits; give it some
                h.drain(proc, 60)
            final = _wal_bytes(h)
        finally:
            stop.set()
            sampler.join(5)
        report = h.finish(proc, drain_seconds=60)
        mib = 2**20
        report.figures.update(
            wal_peak_mib={k: round(v / mib, 1) for k, v in peaks.items()}, wal_final_mib=round(final / mib, 1),
            wal_kib_per_job_under_long_reader=round(grown / 1024 / third, 1))
        if peaks["own readers"] > 16 * mib:
            report.row_failures.append(f"the WAL reached {peaks['own readers'] / mib:.0f} MiB with comfysup's "
                                       "own readers only")
        if final > 64 * mib:
            report.row_failures.append(f"the WAL is still {final / mib:.0f} MiB after the long reader let go")
        return report
    finally:
        h.cleanup()


# -- F1: the result store's disk full -------------------------------------------------------------------


class CannotMount(Exception):
    """The machine refuses a filesystem of our own (not root, no tmpfs): F1 is skipped with this reason."""


def _mount_tmpfs(path: Path, options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        raise CannotMount("F1 needs a small filesystem of its own: mounting a tmpfs needs root")
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"{options},mode=0700", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise CannotMount(f"F1 needs a small filesystem of its own: mount -t tmpfs refused: "
                          f"{result.stderr.strip() or result.returncode}")


def _fill(folder: Path, leave_bytes: int) -> Path:
    """A filler file that takes all the space but ``leave_bytes``."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
    finally:
        os.close(fd)
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    os.truncate(filler, max(0, filler.stat().st_size - max(0, leave_bytes - free)))
    return filler


def f1_disk_full(tmp: Path, seed: int, *, jobs: int, node_ms: float = 5.0) -> Report:
    """The store on a 1 MiB tmpfs, filled but for a few files' room, with too few inodes for every job's
    folder: some jobs' files do not fit (written half, then refused), some jobs cannot even get a folder.
    Each such job fails transiently (a retry adopts the finished run from /history: no re-execution),
    then is dead with the disk-full reason; no partial file ever carries a final name; nothing is done
    without its files; no runner crashes. Then the filesystem is given room and a person retries the
    dead jobs: all done."""
    runner = {"attempts": 3, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2}
    h = ChaosRun(tmp, "F1", seed, node_ms=node_ms, runner=runner)
    mounted = False
    try:
        inodes = 2 + jobs  # the root, the filler, then about half the jobs' folder and file
        _mount_tmpfs(h.store, f"size=1m,nr_inodes={inodes}")
        mounted = True
        filler = _fill(h.store, leave_bytes=64 * 1024)
        # 1024x1024 solid colours: PNGs of ~12 KiB, so a few fit and the next one fails half-written.
        batch = [{**j, "set": {**j["set"], "1.width": 1024, "1.height": 1024}} for j in h.jobs_for(jobs)]
        h.submit(batch)
        proc = h.start()
        h.wait_ready(proc)
        h.drain(proc, 120 + jobs)
        dead = [r[0] for r in h.sql("SELECT id FROM jobs WHERE state = 'dead'")]
        reasons = [r[0] for r in h.sql("SELECT reason FROM jobs WHERE state = 'dead'")]
        done_first = h.terminal() - len(dead)
        restarts = sum(s["runner_restarts"] for s in (h.state() or {}).get("slots", []))
        filler.unlink()
        subprocess.run(["mount", "-o", "remount,size=64m,nr_inodes=100000", str(h.store)], check=True)
        code, _ = h.command("retry", "--all-dead")
        h.faults.record("requeue", ids=dead)
        report = h.finish(proc)
        report.figures.update(done_while_full=done_first, dead_while_full=len(dead), runner_restarts=restarts,
                              no_folder=sum("disk is full" in (r or "") and r.rstrip(")").endswith(i)
                                            for r, i in zip(reasons, dead, strict=True)),
                              retried_after_freeing=len(dead), retry_exit=code)
        if not dead:
            report.row_failures.append("the disk never filled: no job failed")
        bad = [r for r in reasons if "disk is full" not in (r or "")]
        if bad:
            report.row_failures.append(f"dead without the disk-full reason: {bad[:3]}")
        if restarts:
            report.row_failures.append(f"{restarts} runner restart(s): a full disk crashed a runner")
        if report.states.get("done") != report.jobs:
            report.row_failures.append(f"not all done after freeing the space and retrying: {dict(report.states)}")
        return report
    finally:
        h.cleanup()
        if mounted:
            subprocess.run(["umount", "-l", str(h.store)], capture_output=True)


# -- T1: 30% of prompts fail transiently ----------------------------------------------------------------

FAULT_WORDS = ("500", "drop", "oom", "hang")
ATTEMPTS = 4


def scripted_end(words: list[str]) -> tuple[str, int]:
    """How a job whose posts meet ``words`` (then ok) ends: done at the first ok or drop, or dead after ATTEMPTS.
    An OOM is followed by POST /free and one more post without counting an attempt (in the same attempt,
    or, with a job queued behind it, released uncounted), once per counted attempt; every other fault costs one."""
    attempt, freed = 1, False
    for word in [*words, "ok"]:
        if word in ("ok", "drop"):
            return "done", attempt
        if word == "oom" and not freed:
            freed = True
            continue
        attempt, freed = attempt + 1, False
        if attempt > ATTEMPTS:
            return "dead", ATTEMPTS
    raise AssertionError("unreachable: the words end with ok")


def _scripted_faults(tmp: Path, seed: int, row: str, faults: tuple[str, ...], *, jobs: int, node_ms: float,
                     rate: float, posts: int) -> tuple[Report, dict[str, list[str]], ChaosRun]:
    """Every post of every job meets one of ``faults`` with probability ``rate`` (a script of ``posts`` words per
    job); each job must end as :func:`scripted_end` says, each counted retry after at least its backoff."""
    runner = {"attempts": ATTEMPTS, "base_delay_seconds": 0.1, "max_delay_seconds": 0.4, "jitter": False,
              "timeout_seconds": 2.0}
    h = ChaosRun(tmp, row, seed, node_ms=node_ms, runner=runner)
    batch = h.jobs_for(jobs)
    script = {j["id"]: [h.rng.choice(faults) if h.rng.random() < rate else "ok" for _ in range(posts)]
              for j in batch}
    h.set_script(script)
    h.submit(batch)
    proc = h.start()
    h.wait_ready(proc)
    report = h.finish(proc, drain_seconds=120 + jobs * 1.0)
    wrong, early = [], []
    for job_id, words in script.items():
        expected = scripted_end(words)
        state, attempt, reason = h.sql("SELECT state, attempt, reason FROM jobs WHERE id = ?", (job_id,))[0]
        if (state, attempt) != expected or (state == "dead" and f"gave up after {ATTEMPTS} attempts" not in reason):
            wrong.append(f"{job_id} {words}: {state} after {attempt}, expected {expected}")
        # A job queued ahead and given back uncounted to a runner waiting for work ([runner] queue_ahead), or after
        # an OOM with a job behind it: that row is no attempt to wait after.
        rows = h.sql("SELECT started_at, ended_at FROM attempts WHERE job_id = ? AND outcome != "
                     "'released_uncounted' ORDER BY started_at", (job_id,))
        for k, (before, after) in enumerate(itertools.pairwise(rows), start=1):
            delay = min(0.4, 0.1 * 2 ** (k - 1))
            if after[0] - before[1] < delay - 0.02:
                every = h.sql("SELECT attempt, started_at, ended_at, outcome, kind FROM attempts WHERE job_id = ?",
                              (job_id,))
                early.append(f"{job_id}: attempt {k + 1} {after[0] - before[1]:.3f} s after attempt {k}, "
                             f"backoff {delay:g} s; its attempt rows: {every}")
    report.row_failures += [f"wrong end: {w}" for w in wrong] + [f"retried early: {e}" for e in early]
    return report, script, h


def t1_transient_failures(tmp: Path, seed: int, *, jobs: int, node_ms: float = 10.0, rate: float = 0.3) -> Report:
    """Every post of every job fails with probability ``rate`` (500, a dropped socket, OOM, a hang until
    the timeout). Each job ends as its script says (:func:`scripted_end`), and each retry waited at least its
    backoff."""
    h = None
    try:
        report, script, h = _scripted_faults(tmp, seed, "T1", FAULT_WORDS, jobs=jobs, node_ms=node_ms, rate=rate,
                                             posts=ATTEMPTS)
        faults = sum(w != "ok" for words in script.values() for w in words[:1])
        report.figures.update(first_posts_faulty=faults,
                              scripted_dead=sum(1 for words in script.values() if scripted_end(words)[0] == "dead"))
        return report
    finally:
        if h is not None:
            h.cleanup()


def o1_oom_storms(tmp: Path, seed: int, *, jobs: int, node_ms: float = 10.0, rate: float = 0.7) -> Report:
    """OOM storms: most posts of most jobs run out of memory. Each OOM makes its attempt POST /free and
    run the job once more without counting (or give it back uncounted when a job waits behind it); every job is
    still done once, or dead-lettered with the OOM as its reason, as its script says (:func:`scripted_end`)."""
    h = None
    try:
        report, script, h = _scripted_faults(tmp, seed, "O1", ("oom",), jobs=jobs, node_ms=node_ms, rate=rate,
                                             posts=2 * ATTEMPTS)
        dead = h.sql("SELECT id, reason FROM jobs WHERE state = 'dead'")
        report.row_failures += [f"dead without the OOM as its reason: {job_id}: {reason}" for job_id, reason in dead
                                if "OutOfMemoryError" not in (reason or "")]
        state = json.loads((h.state_path).read_text()) if h.state_path.exists() else {}
        frees = sum(int(slot.get("oom_frees") or 0) for slot in state.get("slots") or [])
        report.figures.update(ooms=sum(w == "oom" for words in script.values() for w in words), frees=frees,
                              scripted_dead=sum(1 for words in script.values() if scripted_end(words)[0] == "dead"))
        if frees == 0 and any(words[0] == "oom" for words in script.values()):
            report.row_failures.append("no POST /free was counted in the slots' state")
        return report
    finally:
        if h is not None:
            h.cleanup()


# -- H2: prompts stuck after /interrupt -------------------------------------------------------------------

STUCK_WORD = "hostile:run:ignore-interrupt"
STUCK_LINE = re.compile(r"(\S+): prompt ([0-9a-f-]{36}) did not leave ComfyUI's queue after /interrupt.*"
                        r"restarting ComfyUI \(pid (\d+)\)")
GONE_LINE = re.compile(r"(\S+): ComfyUI is gone, and with it stuck prompt ([0-9a-f-]{36})")


class _StuckWatch:
    """Follows the supervisor's log and records a ``stuck_restart`` fault when a server restarted for a
    stuck prompt is gone: the checker's evidence of when (at the latest) that prompt's execution ended,
    and of which pid, as for a kill. The line is written just before the runner may record the attempt,
    so the fault's time comes before any later run of the job."""

    def __init__(self, h: ChaosRun) -> None:
        self.h = h
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.restarting: dict[str, int] = {}
        self.recorded = 0

    def __enter__(self) -> _StuckWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self._read()  # whatever came after the last pass

    def _run(self) -> None:
        while not self.stop.is_set():
            if not self._read():
                time.sleep(0.005)

    offset = 0
    pending = b""

    def _read(self) -> bool:
        try:
            with open(self.h.log_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return False
        self.offset += len(chunk)
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode(errors="replace")
            if (m := STUCK_LINE.search(line)) is not None:
                self.restarting[m.group(2)] = int(m.group(3))
            elif (m := GONE_LINE.search(line)) is not None and m.group(2) in self.restarting:
                self.h.faults.record("stuck_restart", pids=(self.restarting.pop(m.group(2)),), job=m.group(2),
                                     slot=m.group(1))
                self.recorded += 1
        return bool(chunk)


def h2_stuck_prompts(tmp: Path, seed: int, *, jobs: int, stuck: int, node_ms: float = 10.0) -> Report:
    """Some prompts run a node that ignores /interrupt (``hostile:run:ignore-interrupt``); their jobs time
    out, the prompt stays in the server's queue, and the supervisor restarts that server. Each job ends
    within its deadline with a readable reason, no slot is marked failed, and the servers are restarted
    exactly as many times as prompts got stuck (the checker matches each stuck run to its restart)."""
    runner = {"attempts": 3, "base_delay_seconds": 0.1, "max_delay_seconds": 0.4, "jitter": False,
              "timeout_seconds": 1.5, "leave_queue_seconds": 1.0}
    h = ChaosRun(tmp, "H2", seed, node_ms=node_ms, runner=runner)
    try:
        batch = h.jobs_for(jobs)
        victims = h.rng.sample([j["id"] for j in batch], stuck)
        # A victim is stuck once or twice, then runs (or is stuck up to the last attempt: dead-lettered).
        script = {v: [STUCK_WORD] * h.rng.choice((1, 1, 2, 3)) + ["ok"] for v in victims}
        h.set_script(script)
        h.submit(batch)
        with _StuckWatch(h) as watch:
            proc = h.start()
            h.wait_ready(proc)
            h.drain(proc, 60 + jobs * 0.5 + stuck * 10)
        restarts = [(m.group(1), m.group(2)) for m in STUCK_LINE.finditer(h.log())]
        report = h.finish(proc, drain_seconds=30)
        report.figures["stuck_faults_recorded"] = watch.recorded
        withdrawn = h.sql("SELECT outcome FROM attempts WHERE kind = 'withdrawn'")
        report.figures["withdrawn_from_behind_stuck"] = len(withdrawn)
        if any(outcome != "released_uncounted" for (outcome,) in withdrawn):
            report.row_failures.append(f"a withdrawn job's attempt was counted: {withdrawn}")
        expected_stuck = sum(min(words.count(STUCK_WORD), 3) for words in script.values())
        slots = (h.state() or {}).get("slots", [])
        report.figures.update(stuck_prompts=expected_stuck, stuck_restarts=len(restarts),
                              server_restarts=sum(s["restarts"] for s in slots),
                              failed_slots=[s["name"] for s in slots if s["state"] == "failed"])
        if len(restarts) != expected_stuck:
            report.row_failures.append(f"{len(restarts)} stuck restarts for {expected_stuck} stuck prompts")
        if report.figures["failed_slots"]:
            report.row_failures.append(f"slots marked failed: {report.figures['failed_slots']}")
        # Each stuck attempt ends within its timeout, the wait to leave the queue, and the restart's kill bound.
        bound = runner["timeout_seconds"] + runner["leave_queue_seconds"] + KILL_WAIT_SECONDS + 2.0
        longest = max((e - b for b, e in h.sql("SELECT started_at, ended_at FROM attempts WHERE kind = 'stuck'")),
                      default=0.0)
        report.figures["longest_stuck_attempt_seconds"] = round(longest, 2)
        if longest > bound:
            report.row_failures.append(f"a stuck attempt took {longest:.1f} s, more than {bound:g} s")
        for victim, words in script.items():
            state, attempt, reason = h.sql("SELECT state, attempt, reason FROM jobs WHERE id = ?", (victim,))[0]
            times = words.count(STUCK_WORD)
            expected = ("done", times + 1) if times < 3 else ("dead", 3)
            if (state, attempt) != expected:
                report.row_failures.append(f"{victim} {words}: {state} after {attempt}, expected {expected}")
            if state == "dead" and "did not leave" not in (reason or ""):
                report.row_failures.append(f"{victim}: dead without the stuck reason: {reason}")
            # A job queued ahead behind a stuck prompt is withdrawn before the restart, uncounted:
            # not one of its failures.
            kinds = [k for (k,) in h.sql("SELECT kind FROM attempts WHERE job_id = ? AND kind IS NOT NULL "
                                         "AND kind != 'done' AND NOT (kind = 'withdrawn' AND outcome = "
                                         "'released_uncounted') ORDER BY attempt", (victim,))]
            if kinds != ["stuck"] * min(times, 3):
                report.row_failures.append(f"{victim}: attempt kinds {kinds}")
        return report
    finally:
        h.cleanup()


# -- S1, S2, S3: hostile names, listening sockets, a canary secret ------------------------------------------


H1_SKIP = ("run:ignore-interrupt",)
"""Mutations H1 leaves to other rows: a prompt that ignores /interrupt is H2's. The other ``run:`` words (a saver
that lists a file under the result store's temporary name) are H1's."""


def h1_hostile_server(tmp: Path, seed: int, *, jobs: int, rate: float = 0.5, node_ms: float = 5.0) -> Report:
    """Servers that answer garbage: about ``rate`` of the jobs meet a mutation from fake_comfy's hostile
    catalogue (wrong types at every level, cut and endless bodies, deep nesting, huge values, control
    characters, garbage WebSocket frames, hostile file names and types, a file listed under the result store's
    temporary name), once or twice, chosen from the seed. Every job
    ends within its deadline with a readable reason, attempts never pass the limit, no runner dies (no
    traceback, no runner restart), no slot is marked failed, nothing is written outside the store, and no
    run of 8 characters of the partner key in every job's extra_data appears anywhere."""
    from fake_comfy.hostile import CATALOGUE

    runner = {"attempts": 3, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
              "timeout_seconds": 4.0, "http_timeout_seconds": 1.5, "poll_seconds": 0.2}
    h = ChaosRun(tmp, "H1", seed, node_ms=node_ms, runner=runner)
    try:
        key = uuid.UUID(int=h.rng.getrandbits(128)).hex + uuid.UUID(int=h.rng.getrandbits(128)).hex[:8]
        h.fragment_canaries = [key]
        batch = h.jobs_for(jobs, extra_data={"api_key_comfy_org": key})
        names = sorted(n for n in CATALOGUE if not n.startswith(H1_SKIP))
        script = {j["id"]: [f"hostile:{h.rng.choice(names)}"] * h.rng.choice((1, 2)) + ["ok"]
                  for j in batch if h.rng.random() < rate}
        h.set_script(script)
        h.submit(batch)
        proc = h.start()
        h.wait_ready(proc)
        report = h.finish(proc, drain_seconds=60 + jobs * 2)
        limit = runner["attempts"]
        over = h.sql("SELECT id, attempt FROM jobs WHERE attempt > ?", (limit,))
        counted = h.sql("SELECT job_id, count(*) FROM attempts WHERE outcome NOT IN ('released_uncounted') "
                        "GROUP BY job_id HAVING count(*) > ?", (limit,))
        report.row_failures += [f"{i}: {n} attempts against a limit of {limit}" for i, n in over + counted]
        for job_id, reason in h.sql("SELECT id, reason FROM jobs WHERE state = 'dead'"):
            if not reason or not reason.isprintable() or len(reason) > 2100:
                report.row_failures.append(f"{job_id}: an unreadable reason {str(reason)[:200]!r}")
        bound = runner["timeout_seconds"] + 2 * runner["http_timeout_seconds"] + 3.0
        longest = max((e - b for b, e in h.sql("SELECT started_at, ended_at FROM attempts WHERE ended_at IS NOT NULL")),
                      default=0.0)
        if longest > bound:
            report.row_failures.append(f"an attempt took {longest:.1f} s, more than {bound:g} s")
        log = h.log()
        if "Traceback" in log:
            report.row_failures.append("a traceback in the supervisor's log: " + log[log.index("Traceback"):][:300])
        slots = (h.state() or {}).get("slots", [])
        failed = [s["name"] for s in slots if s["state"] == "failed"]
        runner_restarts = sum(s.get("runner_restarts", 0) for s in slots)
        if failed:
            report.row_failures.append(f"slots marked failed by bad answers: {failed}")
        if runner_restarts:
            report.row_failures.append(f"{runner_restarts} runner restart(s): a runner died of an answer")
        mutated = {words[0].split(":", 1)[1] for words in script.values()}
        report.figures.update(hostile_jobs=len(script), mutations=len(mutated), catalogue=len(names),
                              longest_attempt_seconds=round(longest, 2), failed_slots=failed,
                              runner_restarts=runner_restarts)
        return report
    finally:
        h.cleanup()


def s1_hostile_names(tmp: Path, seed: int, *, jobs: int, node_ms: float = 5.0) -> Report:
    """A server that names its outputs ``../../x``, ``/etc/x``, subfolder ``../../..`` or ``/tmp``: those
    jobs are dead with "unsafe output name", nothing is written outside the job folders, and the other
    jobs are done."""
    h = ChaosRun(tmp, "S1", seed, node_ms=node_ms)
    try:
        batch = h.jobs_for(jobs)
        hostile = {j["id"]: j for j in batch if h.rng.random() < 0.5}
        h.set_script({i: ["hostile"] for i in hostile})
        h.submit(batch)
        proc = h.start()
        h.wait_ready(proc)
        report = h.finish(proc)
        servers = h.tmp / "var" / "comfyui"
        for job_id, line in hostile.items():
            state, reason = h.sql("SELECT state, reason FROM jobs WHERE id = ?", (job_id,))[0]
            if state != "dead" or "unsafe output name" not in (reason or ""):
                report.row_failures.append(f"{job_id}: {state}, {reason!r}")
            prefix = line["set"]["3.filename_prefix"]
            for place in (h.store.parent.parent, h.store.parent, Path("/etc"), Path("/tmp"), h.tmp):
                report.outside_files += [str(p) for p in place.glob(f"{prefix}_*")]
            report.outside_files += [str(p) for p in h.tmp.rglob(f"{prefix}_*")
                                     if servers not in p.parents]  # the server's own output folder
        report.figures.update(hostile=len(hostile))
        return report
    finally:
        h.cleanup()


def s2_listening_sockets(tmp: Path, seed: int, *, jobs: int, node_ms: float = 50.0) -> Report:
    """Every socket the supervisor, its runners and its ComfyUI servers listen on (or bind, for UDP) is on a
    loopback address, checked while jobs run."""
    h = ChaosRun(tmp, "S2", seed, node_ms=node_ms)
    try:
        h.submit(h.jobs_for(jobs))
        proc = h.start()
        h.wait_ready(proc)
        wait_for(lambda: any(s.get("job") for s in h.slots()), 30, "a job to run", h.describe)
        family = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        listening = [c for c in psutil.net_connections(kind="inet") if c.pid in family and c.laddr
                     and (c.status == psutil.CONN_LISTEN or c.type == 2)]  # SOCK_DGRAM: bound UDP
        report = h.finish(proc)
        exposed = [f"pid {c.pid} on {c.laddr.ip}:{c.laddr.port}" for c in listening
                   if not _loopback(c.laddr.ip)]
        report.figures.update(processes=len(family), listening=sorted({f"{c.laddr.ip}:{c.laddr.port}"
                                                                       for c in listening}))
        if len(listening) < 2:
            report.row_failures.append(f"expected both servers listening, found {len(listening)} socket(s)")
        report.row_failures += [f"not loopback: {e}" for e in exposed]
        return report
    finally:
        h.cleanup()


def _loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def s3_canary_secret(tmp: Path, seed: int, *, jobs: int, node_ms: float = 5.0) -> Report:
    """A canary in every job's extra_data (a partner-node API key, and a value under a token-like name),
    and failures of every kind so reasons and logs have something to say: the canaries appear in no log,
    reason, status, show or results output, supervisor.json or stored file — only in the job's own spec."""
    h = ChaosRun(tmp, "S3", seed, node_ms=node_ms, runner={"attempts": 2, "timeout_seconds": 2.0})
    try:
        key, token = f"canary-key-{seed:08x}-{os.getpid()}", f"canary-token-{seed:08x}-{os.getpid()}"
        h.canaries = [key, token]
        batch = h.jobs_for(jobs, extra_data={"api_key_comfy_org": key, "my_service_token": token})
        words = ("ok", "error", "oom", "500", "invalid", "hostile", "hang", "drop")
        h.set_script({j["id"]: [words[i % len(words)], words[(i * 3 + 1) % len(words)]]
                      for i, j in enumerate(batch)})
        h.submit(batch)
        proc = h.start()
        h.wait_ready(proc)
        report = h.finish(proc, drain_seconds=120 + jobs)
        report.figures.update(outputs_searched=len(h.outputs), dead=report.states.get("dead", 0),
                              metrics_searched="GET /metrics" in h.outputs)
        return report
    finally:
        h.cleanup()


# -- B1: fuzzed jobs.jsonl lines -----------------------------------------------------------------------------


def _b1_line(kind: str, n: int, text: str, earlier: list[str], wf: dict[str, Any]) -> tuple[bytes, bool, str | None]:
    """One line of a fuzzed file: its bytes, whether submit must call it bad, and the id of a good one."""
    job_id = str(uuid.uuid4())
    base: dict[str, Any] = {"id": job_id, "workflow": "wf.json", "set": {"1.color": n, "3.filename_prefix": f"b{n}"}}
    inline = json.loads(json.dumps(wf))
    if kind == "good":
        return json.dumps(base).encode(), False, job_id
    if kind == "text":
        raw = text.replace("\n", " ").encode("utf-8", "surrogatepass")
        return raw, bool(raw.strip()), None
    if kind == "truncated":
        full = json.dumps(base)
        return full[: n % (len(full) - 1) + 1].encode(), True, None
    if kind == "not_utf8":
        return json.dumps(base).replace("b", "b\udcff", 1).encode("utf-8", "surrogateescape"), True, None
    if kind == "deep":
        return b"[" * 100_000 + b"]" * 100_000, True, None
    if kind == "nan":
        return json.dumps({**base, "priority": float("nan")}).encode(), True, None
    changes: dict[str, Any] = {
        "id_upper": {"id": job_id.upper()}, "id_int": {"id": n}, "id_garbage": {"id": text or "x"},
        "id_braces": {"id": "{" + job_id + "}"}, "id_null": {"id": None},
        "duplicate": {"id": earlier[n % len(earlier)] if earlier else "dup"},
        "workflow_missing_file": {"workflow": f"missing-{n}.json"}, "workflow_number": {"workflow": n},
        "workflow_none": {"workflow": None}, "workflow_ui": {"workflow": {"nodes": [], "links": []}},
        "workflow_empty": {"workflow": {}},
        "dangling": {"workflow": {**inline, "2": {**inline["2"], "inputs": {"image": ["9", 0]}}}},
        "cycle": {"workflow": {**inline, "1": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}}}},
        "no_output": {"workflow": {"1": inline["1"]}},
        "set_list": {"set": [n]}, "set_unknown_node": {"set": {"9.width": n}},
        "set_unknown_input": {"set": {"1.nonsense": n}}, "set_bad_key": {"set": {"width": n}},
        "priority_float": {"priority": n + 0.5}, "priority_str": {"priority": str(n)},
        "priority_bool": {"priority": True}, "priority_huge": {"priority": 2**70 + n},
        "extra_list": {"extra_data": [n]}, "meta_str": {"meta": text}, "unknown_key": {"foo": n},
    }
    line = {**base, **changes[kind]}  # "id": null stays: a line without an id is a good one (its id is derived)
    if line.get("workflow") is None:
        del line["workflow"]
    return json.dumps(line).encode(), True, None


B1_KINDS = ("good", "good", "good", "text", "truncated", "not_utf8", "deep", "nan", "id_upper", "id_int",
            "id_garbage", "id_braces", "id_null", "duplicate", "workflow_missing_file", "workflow_number",
            "workflow_none", "workflow_ui", "workflow_empty", "dangling", "cycle", "no_output", "set_list",
            "set_unknown_node", "set_unknown_input", "set_bad_key", "priority_float", "priority_str",
            "priority_bool", "priority_huge", "extra_list", "meta_str", "unknown_key")


def b1_fuzzed_lines(tmp: Path, seed: int, *, examples: int) -> Report:
    """Files of good lines mixed with fuzzed ones (hypothesis: random text, cut JSON, bad UTF-8, deep
    nesting, NaN, and each way a line can be wrong: its id, workflow, graph, set, priority, keys, a
    repeated id). ``comfysup submit`` names every bad line as ``file:line:`` and nothing else, exits 2,
    and inserts nothing of such a file; a clean file goes in whole. Never a traceback."""
    h = ChaosRun(tmp, "B1", seed)
    (h.tmp / "wf.json").write_text(json.dumps(TRIVIAL))
    counts: Counter[str] = Counter()
    line = strategies.tuples(strategies.sampled_from(B1_KINDS), strategies.integers(0, 2**24 - 1),
                             strategies.text(max_size=60))

    @fixed_seed(seed)
    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(strategies.lists(line, min_size=1, max_size=10), strategies.booleans())
    def one_file(drawn: list[tuple[str, int, str]], clean: bool) -> None:
        raws, bad, good = [], set(), []
        for number, (kind, n, text) in enumerate(drawn, start=1):
            kind = "good" if clean else kind  # about half the files are clean: they must go in whole
            raw, is_bad, job_id = _b1_line(kind, n, text, good, TRIVIAL)
            raws.append(raw)
            if is_bad:
                bad.add(number)
            if job_id:
                good.append(job_id)
        path = h.tmp / f"fuzz-{counts['files']}.jsonl"
        counts["files"] += 1
        path.write_bytes(b"\n".join(raws) + b"\n")
        try:
            code, out = h.command("submit", str(path))
        except BaseException as exc:  # a traceback: the finding itself
            raise AssertionError(f"submit raised {type(exc).__name__}: {exc}") from exc
        reported = {int(m) for m in re.findall(rf"^{re.escape(str(path))}:(\d+): (?!warning)", out, re.M)}
        present = sum(1 for (n,) in h.sql(f"SELECT 1 FROM jobs WHERE id IN ({','.join('?' * len(good))})",
                                          tuple(good))) if good else 0
        assert "Traceback" not in out, out
        if bad:
            counts["rejected"] += 1
            counts["bad lines"] += len(bad)
            h.submissions.append(Submission(path, tuple(good), "rejected"))
            assert code == 2, f"exit {code} for a file with bad lines {sorted(bad)}:\n{out}"
            assert reported == bad, f"reported lines {sorted(reported)}, bad lines {sorted(bad)}:\n{out}"
            assert present == 0, f"{present} job(s) of a rejected file are in the queue"
        else:
            counts["accepted"] += 1
            h.submissions.append(Submission(path, tuple(good), "accepted"))
            assert code == 0 and not reported, out
            assert present == len(good), f"{present} of {len(good)} jobs of a clean file are in the queue"

    report = Report()
    try:
        one_file()
    except AssertionError as exc:
        report.row_failures.append(str(exc)[:3000])
    report.integrity = h.sql("PRAGMA integrity_check")[0][0] if h.queue_path.exists() else "ok"
    report.figures.update(files=counts["files"], accepted=counts["accepted"], rejected=counts["rejected"],
                          bad_lines=counts["bad lines"], seed=seed)
    report.jobs = sum(len(s.ids) for s in h.submissions if s.outcome == "accepted")
    return report
from chaos.api_rows import a1_api_kills  # noqa: E402, F401
from chaos.broker_rows import r1_consumer_killed_before_ack, r2_broker_restarted, r3_connections_closed  # noqa: E402, F401
from chaos.s3_rows import u1_own_server, u2_own_server  # noqa: E402, F401
