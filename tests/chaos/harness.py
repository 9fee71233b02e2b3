"""``comfysup run`` on ``cpu:2`` for the chaos suite: fake servers that keep an execution log, a fault log,
every submission recorded, and at the end the checker's report.

Built on tests/supervisor_support.py's ``Supervised`` (the acceptance tests' harness), with settings that
let a fault be injected every fraction of a second without tripping the supervisor's "failed slot" rule
on purpose: restarts after 0.2 s at most, a quick failure only under 0.5 s of life. The kill loops wait
for a process to have lived longer than that before killing it, so a slot marked failed would be a
finding, not an artefact of the schedule.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import time
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests
import tomli_w
from input_images import INVERT, random_png
from supervisor_support import Supervised, gone, job, processes_under, wait_for

from chaos.checker import Evidence, Report, Submission, check
from chaos.faults import FaultLog, scenario_rng
from comfysup.cli import main as cli
from comfysup.config import load_config

RUNNER = {"attempts": 8, "base_delay_seconds": 0.05, "max_delay_seconds": 0.5, "jitter": True,
          "timeout_seconds": 30.0, "poll_seconds": 0.2, "lease_seconds": 10.0, "heartbeat_seconds": 0.5,
          "grace_seconds": 3.0, "http_timeout_seconds": 2.0}
SUPERVISOR = {"runner_timeout_seconds": 5.0, "quick_failure_seconds": 0.5, "max_quick_failures": 5,
              "restart_max_delay_seconds": 0.2}
MIN_LIFE_SECONDS = 0.7
"""A process is killed only after it lived this long: longer than quick_failure_seconds."""
SHOW_SAMPLE = 12
"""Jobs whose ``comfysup show`` output is captured (besides every dead one) for the secret search."""
SHARED_INPUTS = 3
"""Input images shared between jobs (each job with an input takes one of these or one of its own)."""


def hash_seed(text: str) -> int:
    """A stable seed from text (``hash()`` of a str changes per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ChaosRun(Supervised):
    """One scenario's installation: config, queue, fake servers with ``--exec-log``, fault log, seed."""

    def __init__(self, tmp: Path, name: str, seed: int, *, node_ms: float = 20.0,
                 runner: dict[str, Any] | None = None, supervisor: dict[str, Any] | None = None,
                 queue: dict[str, Any] | None = None, extra_args: tuple[str, ...] = (),
                 input_share: float = 0.0) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        super().__init__(tmp, script={}, node_ms=node_ms, runner={**RUNNER, **(runner or {})},
                         supervisor={**SUPERVISOR, **(supervisor or {})})
        self.name = name
        self.seed = seed
        self.rng = scenario_rng(seed, name)
        self.exec_log = tmp / "exec.jsonl"
        self.script_path = tmp / "script.json"
        doc = tomllib.loads(self.config_path.read_text())
        doc["comfyui"]["extra_args"] = [*doc["comfyui"]["extra_args"], "--exec-log", str(self.exec_log),
                                        *extra_args]
        doc["queue"].update(queue or {})
        self.config_path.write_bytes(tomli_w.dumps(doc).encode())
        self.config = load_config(str(self.config_path), env={})
        self.queue_path = self.config.resolve(self.config.queue.path)
        self.store = self.config.resolve(self.config.store.dir)
        self.faults = FaultLog(tmp / "faults.jsonl")
        self.submissions: list[Submission] = []
        self.canaries: list[str] = []
        self.fragment_canaries: list[str] = []
        self.outputs: dict[str, str] = {}
        self.figures: dict[str, Any] = {}
        self.seen: dict[int, float] = {}
        """When a pid was first seen in supervisor.json (monotonic), to know how long it has lived."""
        self.next_job = 0
        self.input_share = input_share
        """The share of new jobs that bring an input image (LoadImage → ImageInvert → SaveImage)."""
        self.inputs: dict[str, Path] = {}
        """Job id → the input image it was submitted with: the checker holds each output to it."""
        self.bucket_objects: Callable[[], dict[str, bytes]] | None = None
        """Rows with outputs in a bucket: every object of the run's bucket by s3:// URI, read at the end."""

    # -- jobs -------------------------------------------------------------------------------------------

    def jobs_for(self, count: int, **extra: Any) -> list[dict[str, Any]]:
        """``count`` new trivial jobs (a colour each, so no server serves one from its cache); of them, about
        ``input_share`` bring an input image to invert instead, one shared with other jobs or their own."""
        out = []
        for n in range(self.next_job, self.next_job + count):
            spec = {**job(n), **extra}
            if self.input_share and self.rng.random() < self.input_share:
                spec = {**spec, **self._invert_job(n)}
            out.append(spec)
        self.next_job += count
        return out

    def _invert_job(self, n: int) -> dict[str, Any]:
        folder = self.tmp / "inputs"
        folder.mkdir(exist_ok=True)
        workflow = folder / "invert.json"
        if not workflow.exists():
            workflow.write_text(json.dumps(INVERT))
        shared = self.rng.randrange(SHARED_INPUTS * 2)
        name = f"shared{shared}.png" if shared < SHARED_INPUTS else f"own{n}.png"
        path = folder / name
        if not path.exists():  # pixels differ per image: seeded by its name
            path.write_bytes(random_png(hash_seed(f"{self.seed}/{name}"), width=8, height=8))
        self.inputs[job(n)["id"]] = path
        return {"workflow": "inputs/invert.json",  # relative to the jobs files, written in self.tmp
                "set": {"1.image": {"file": f"inputs/{name}"}, "3.filename_prefix": f"job{n}"}}

    def write_jobs(self, jobs: list[dict[str, Any]]) -> Path:
        path = self.tmp / f"jobs-{uuid.uuid4().hex[:8]}.jsonl"
        path.write_text("".join(json.dumps(j) + "\n" for j in jobs))
        return path

    def submit(self, jobs: list[dict[str, Any]]) -> list[str]:  # type: ignore[override]
        """Submit in this process, through the CLI's code; the file and its outcome are recorded."""
        path = self.write_jobs(jobs)
        code, _ = self.command("submit", str(path))
        ids = tuple(j["id"] for j in jobs)
        self.submissions.append(Submission(path, ids, "accepted" if code == 0 else "rejected"))
        assert code == 0, f"submit refused {path}"
        return list(ids)

    def set_script(self, script: dict[str, list[str]]) -> None:
        """Per job id, the words the fake servers play, one per post (re-read on every post; atomic)."""
        tmp = self.script_path.with_name(".script.json.tmp")
        tmp.write_text(json.dumps(script))
        os.replace(tmp, self.script_path)

    def command(self, *args: str) -> tuple[int, str]:
        """A comfysup command run in this process (fast, and what a person would see): exit code, output."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli([args[0], "--config", str(self.config_path), *args[1:]])
        return code, out.getvalue() + err.getvalue()

    # -- the queue, read directly ---------------------------------------------------------------------

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        conn = sqlite3.connect(f"file:{self.queue_path}?mode=ro", uri=True, timeout=30)
        try:
            return conn.execute(query, args).fetchall()
        finally:
            conn.close()

    def active(self) -> int:
        return self.sql("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running', 'storing')")[0][0]

    def runnable(self) -> int:
        """Jobs queued or running: those a runner holds or may claim (a staged one waits for the bucket alone)."""
        return self.sql("SELECT count(*) FROM jobs WHERE state IN ('queued', 'running')")[0][0]

    def terminal(self) -> int:
        return self.sql("SELECT count(*) FROM jobs WHERE state IN ('done', 'dead', 'cancelled')")[0][0]

    def drain(self, proc: subprocess.Popen[bytes], seconds: float) -> None:
        """Wait until nothing is queued or running, the supervisor alive all along."""
        def drained() -> bool:
            assert proc.poll() is None, f"the supervisor exited with {proc.returncode}\n{self.describe()}"
            return self.active() == 0

        wait_for(drained, seconds, f"the queue of {self.name} to drain", self.describe)

    # -- processes --------------------------------------------------------------------------------------

    def slots(self) -> list[dict[str, Any]]:
        state = self.state() or {}
        now = time.monotonic()
        for slot in state.get("slots", []):
            for pid in (slot.get("pid"), slot.get("runner_pid")):
                if pid:
                    self.seen.setdefault(pid, now)
        return list(state.get("slots", []))

    def age(self, pid: int | None) -> float:
        return time.monotonic() - self.seen[pid] if pid in self.seen else 0.0

    def wait_runner(self, name: str, *, old: int | None, seconds: float = 20.0) -> dict[str, Any]:
        """The slot once its runner is a new one that has lived MIN_LIFE_SECONDS."""
        def ready() -> dict[str, Any] | None:
            slot = next((s for s in self.slots() if s["name"] == name), None)
            pid = slot and slot.get("runner_pid")
            ok = pid and pid != old and slot["runner_state"] == "running" and self.age(pid) >= MIN_LIFE_SECONDS
            return slot if ok else None

        return wait_for(ready, seconds, f"a new runner on {name}", self.describe)

    def wait_server(self, name: str, *, old: int | None, seconds: float = 30.0) -> dict[str, Any]:
        """The slot once its ComfyUI is a new one that answers and has lived MIN_LIFE_SECONDS."""
        def ready() -> dict[str, Any] | None:
            slot = next((s for s in self.slots() if s["name"] == name), None)
            pid = slot and slot.get("pid")
            ok = pid and pid != old and slot["state"] == "running" and self.age(pid) >= MIN_LIFE_SECONDS
            return slot if ok else None

        return wait_for(ready, seconds, f"ComfyUI on {name} to run again", self.describe)

    def kill(self, kind: str, pid: int, *, job: str | None = None, also: tuple[int, ...] = (),
             **detail: Any) -> None:
        """SIGKILL ``pid`` and record the fault (``also``: pids that die with it, e.g. a supervisor's children)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.faults.record(kind, pids=(pid, *also), job=job, **detail)

    def kill_supervisor(self, proc: subprocess.Popen[bytes]) -> list[int]:
        """kill -9 the supervisor; its servers and runners die with it (PR_SET_PDEATHSIG). Returns those."""
        children = [pid for s in self.slots() for pid in (s.get("pid"), s.get("runner_pid")) if pid]
        self.kill("supervisor_kill", proc.pid, also=tuple(children))
        proc.wait(10)
        return children

    def strays(self) -> list[int]:
        """Processes of this installation still alive (none may be, once the supervisor is gone)."""
        return [p.pid for p in processes_under(self.tmp)]

    # -- the end --------------------------------------------------------------------------------------

    def capture_outputs(self) -> None:
        """What a person sees (status, results, show of every dead job and a sample of the others): the
        secret search reads these."""
        self.outputs["status"] = self.command("status")[1]
        self.outputs["results --csv"] = self.command("results", "--csv")[1]
        dead = [r[0] for r in self.sql("SELECT id FROM jobs WHERE state = 'dead'")]
        sample = [r[0] for r in self.sql(f"SELECT id FROM jobs WHERE state != 'dead' LIMIT {SHOW_SAMPLE}")]
        for job_id in dead + sample:
            self.outputs[f"show {job_id}"] = self.command("show", job_id, "--workflow")[1]
            self.outputs[f"show --json {job_id}"] = self.command("show", job_id, "--json")[1]

    def capture_metrics(self) -> None:
        """The supervisor's status page and /metrics, while it still serves them (secrets are searched)."""
        url = (self.state() or {}).get("metrics_url")
        if not url:
            return
        for page in ("metrics", ""):
            with contextlib.suppress(requests.RequestException):
                self.outputs[f"GET /{page}"] = requests.get(f"{url.rstrip('/')}/{page}", timeout=5).text

    def finish(self, proc: subprocess.Popen[bytes] | None, *, drain_seconds: float = 120.0) -> Report:
        """Drain, stop the supervisor (SIGTERM: it must exit 0), then check everything the run left.
        Without a supervisor (``proc`` None: submits alone) jobs need not have run."""
        stuck = None
        if proc is not None:
            try:
                self.wait_ready(proc, seconds=30)  # a SIGTERM before its handlers exist would just kill it
                self.drain(proc, drain_seconds)
            except AssertionError as exc:  # the checker still runs: it says which jobs never ended
                stuck = str(exc).splitlines()[0]
            self.capture_metrics()
            self.figures["supervisor_exit"] = self.stop(proc) if proc.poll() is None else proc.returncode
        self.capture_outputs()
        evidence = self.evidence()
        evidence.require_terminal = proc is not None
        report = check(evidence)
        if stuck:
            report.row_failures.append(stuck)
        if proc is not None and self.figures["supervisor_exit"] != 0:
            report.row_failures.append(f"SIGTERM: the supervisor exited {self.figures['supervisor_exit']}, not 0")
        report.figures.update(self.figures)
        report.figures["seed"] = self.seed
        return report

    def evidence(self) -> Evidence:
        return Evidence(root=self.tmp, queue_path=self.queue_path, store=self.store, exec_logs=[self.exec_log],
                        faults=self.faults.faults(), submissions=self.submissions, logs=[self.log_path],
                        canaries=self.canaries, fragment_canaries=self.fragment_canaries, outputs=self.outputs,
                        not_scanned=[s.path for s in self.submissions], ended_at=time.time(),
                        inputs=dict(self.inputs),
                        objects=self.bucket_objects() if self.bucket_objects is not None else None)

    def all_gone(self) -> bool:
        return all(gone(pid) for pid in self.strays())
