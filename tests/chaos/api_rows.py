"""Row A1: jobs submitted through the Comfy API v2 while the API process, runners and servers are
killed, by clients that retry with the same ``Idempotency-Key`` after every dropped connection.

``comfysup run`` serves ``/api/v2`` as a supervised child. Client threads POST jobs (``Idempotency-Key`` = the
job's id) until each is answered 201; a connection refused, reset or cut before the answer is retried with the
same key and body, as comfy-sdk's own retry does. Some first tries are dropped by the client itself: right
after the request is sent (racing the API, which may or may not commit the job before it notices), or once the
job is in the queue but before the answer is read (a client that timed out just too early): the key is single-use
(the spec's reject-on-duplicate), so the retry of the latter must be answered 422 ``idempotency_key_reuse``
naming that job (``details.job_id``), which the client takes as its answer, and neither may make a second job.
Meanwhile the API process is SIGKILLed, half the times by a client the instant its request is sent, and so are
runners and servers.

The jobs the clients saw accepted are the run's submissions, so the checker finds a job the API lost (``lost``)
and a second job made by a retry (``unknown_jobs``), besides its usual double runs and missing files.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import threading
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import tomli_w
from port_support import server_port
from supervisor_support import TRIVIAL, job_id

from chaos.checker import Report, Submission
from chaos.harness import MIN_LIFE_SECONDS, ChaosRun
from comfysup.config import load_config

MAX_ACTIVE = 8
"""Clients submit while the queue holds fewer unfinished jobs than this, so faults land on a busy system."""
RETRY_SECONDS = (0.02, 0.3)
"""A client's pause before it retries (full jitter, as comfy-sdk's retry)."""


def _free_port() -> int:
    """A port for a server started (or restarted) on it later, which no connection can take (port_support)."""
    return server_port()


def _body(n: int) -> dict[str, Any]:
    """Job n of supervisor_support.job(n) as an API body: the colour and file prefix set in the graph."""
    graph = json.loads(json.dumps(TRIVIAL))
    graph["1"]["inputs"]["color"] = n
    graph["3"]["inputs"]["filename_prefix"] = f"job{n}"
    return {"workflow": graph, "metadata": {"row": "A1", "n": str(n)}}


def _reused(answer: httpx.Response) -> str | None:
    """The job an earlier try with this key made, when the answer is 422 ``idempotency_key_reuse``."""
    if answer.status_code != 422:
        return None
    error = answer.json().get("error") or {}
    return (error.get("details") or {}).get("job_id") if error.get("code") == "idempotency_key_reuse" else None


class ApiClients:
    """Client threads that submit numbered jobs through the API until told to stop; every job is retried with
    its key until it is answered 201 (or the run's deadline passes, which the row reports)."""

    def __init__(self, h: ChaosRun, url: str, clients: int, drop_share: float, seed: int,
                 aim: Callable[[], int | None], aimed: int) -> None:
        self.h = h
        self.aim = aim
        """The API's pid when it may be killed now (alive long enough), else None."""
        self.aimed_left = aimed
        self.url = url
        self.host, self.port = url.removeprefix("http://").split(":")
        self.drop_share = drop_share
        self.rng = random.Random(f"{seed}/A1/clients")
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.accepted: list[dict[str, Any]] = []
        self.counts = {"posts": 0, "connection_failures": 0, "cut_before_answer": 0, "client_drops": 0,
                       "drops_after_commit": 0, "reused": 0, "reused_after_drop": 0,
                       "reused_after_commit_drop": 0, "server_errors": 0,
                       "kills_mid_request": 0}
        self.refusals: list[str] = []
        self.threads = [threading.Thread(target=self._work, name=f"api-client-{i}", daemon=True)
                        for i in range(clients)]

    def __enter__(self) -> ApiClients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)

    def _count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def _next(self) -> tuple[int, float, str] | None:
        """The next job's number, its retry jitter, and how its first try goes: ``plain``, ``drop`` (the client
        closes the connection unread) or ``kill`` (the API is SIGKILLed while the request is in flight)."""
        with self.lock:
            if self.stop.is_set():
                return None
            n = self.h.next_job
            self.h.next_job += 1
            first = "drop" if self.rng.random() < self.drop_share else "plain"
            if first == "plain" and self.aimed_left and self.rng.random() < 0.5:
                first = "kill"
            return n, self.rng.random(), first

    def _work(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0)) as client:
            while not self.stop.is_set():
                if self.h.active() >= MAX_ACTIVE:
                    self.stop.wait(0.02)
                    continue
                picked = self._next()
                if picked is None:
                    return
                n, jitter, first = picked
                self._submit(client, n, jitter, first)

    def _submit(self, client: httpx.Client, n: int, jitter: float, first: str) -> None:
        key, body = job_id(n), _body(n)
        dropped = committed = False
        if first != "plain":
            dropped, committed = self._send_and_cut(key, body, kill=first == "kill", after_commit=jitter < 0.5)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            self._count("posts")
            try:
                answer = client.post(f"{self.url}/api/v2/jobs", json=body, headers={"Idempotency-Key": key})
            except httpx.ConnectError:
                self._count("connection_failures")  # the API is down: it is restarted by the supervisor
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError, httpx.ReadTimeout):
                self._count("cut_before_answer")  # sent, no answer: the API was killed mid-request
            else:
                reused = _reused(answer)
                if answer.status_code == 201 or reused:
                    with self.lock:
                        self.accepted.append({"id": reused or answer.json()["id"], "key": key, "n": n})
                        self.counts["reused"] += bool(reused)
                        self.counts["reused_after_drop"] += bool(reused) and dropped
                        self.counts["reused_after_commit_drop"] += bool(reused) and committed
                    return
                if answer.status_code < 500 and answer.status_code != 429:
                    with self.lock:
                        self.refusals.append(f"job {n}: {answer.status_code} {answer.text[:300]}")
                    return
                self._count("server_errors")
            time.sleep(random.uniform(*RETRY_SECONDS) * (0.5 + jitter))
        with self.lock:
            self.refusals.append(f"job {n}: not accepted within 90 s of retries")

    def _send_and_cut(self, key: str, body: dict[str, Any], *, kill: bool, after_commit: bool
                      ) -> tuple[bool, bool]:
        """The whole request sent, then either the client closes the connection before reading the answer (at
        once, or once the job is in the queue when ``after_commit``) or the API process is SIGKILLed at once,
        racing the commit; the retry that follows must not make a second job. Returns (the request was sent
        and its answer never read, the job was in the queue when the client went)."""
        pid = self.aim() if kill else None
        if kill and pid is None:
            return False, False  # the API is restarting: this try is a plain one
        conn = http.client.HTTPConnection(self.host, int(self.port), timeout=5)
        try:
            conn.request("POST", "/api/v2/jobs", body=json.dumps(body).encode(),
                         headers={"Idempotency-Key": key, "Content-Type": "application/json"})
            if pid is None:
                committed = after_commit and self._committed(key)
                self._count("drops_after_commit" if committed else "client_drops")
                return True, committed
            with self.lock:
                if not self.aimed_left:
                    return False, False
                self.aimed_left -= 1
            self.h.kill("api_kill", pid, job=key, after="request")
            self._count("kills_mid_request")
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn.getresponse().read()
                return False, False  # answered before the kill landed: nothing was cut
            self._count("cut_before_answer")
            return True, False
        except OSError:
            return False, False  # the API was down: nothing was sent
        finally:
            with contextlib.suppress(OSError):
                conn.sock and conn.sock.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _committed(self, key: str) -> bool:
        """Wait (up to 10 s) for the job to be in the queue: the API committed it and is about to answer."""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.h.sql("SELECT 1 FROM jobs WHERE id = ?", (key,)):
                return True
            time.sleep(0.002)
        return False


def _api_process(h: ChaosRun, proc: Any) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children():
            with contextlib.suppress(psutil.Error):
                if "api" in child.cmdline():
                    return child
    return None


def a1_api_kills(tmp: Path, seed: int, *, api_kills: int, runner_kills: int, server_kills: int, clients: int = 4,
                 drop_share: float = 0.25, node_ms: float = 30.0, spread_seconds: float = 0.5) -> Report:
    """See the module docstring. Half the API kills are aimed by a client at a request it has just sent; the
    other kills are spread at random over the three kinds. Each process is killed once and only after it lived
    MIN_LIFE_SECONDS; the clients submit until the last kill, then the queue drains."""
    h = ChaosRun(tmp, "A1", seed, node_ms=node_ms)
    port = _free_port()
    doc = tomllib.loads(h.config_path.read_text())
    doc["api"] = {"listen": f"127.0.0.1:{port}"}
    h.config_path.write_bytes(tomli_w.dumps(doc).encode())
    h.config = load_config(str(h.config_path), env={})
    url = f"http://127.0.0.1:{port}"
    try:
        proc = h.start()
        h.wait_ready(proc)
        h.wait_api(url)
        aimed = api_kills // 2
        left = {"api_kill": api_kills - aimed, "runner_kill": runner_kills, "server_kill": server_kills}
        killed: set[int] = set()
        first_seen: dict[int, float] = {}
        guard = threading.Lock()

        def aim() -> int | None:
            with guard:
                target = _target(h, proc, "api_kill", killed, first_seen)
                if target is not None:
                    killed.add(target[0])
                return None if target is None else target[0]

        due = time.monotonic() + h.rng.uniform(0, spread_seconds)
        with ApiClients(h, url, clients, drop_share, seed, aim, aimed) as api_clients:
            deadline = time.monotonic() + 60 + 3 * (sum(left.values()) + aimed)
            while (any(left.values()) or api_clients.aimed_left) and time.monotonic() < deadline:
                time.sleep(0.01)
                if time.monotonic() < due:
                    continue
                kinds = [k for k, v in left.items() if v]
                if not kinds:
                    continue  # only aimed kills left: the clients make them
                kind = h.rng.choice(kinds)
                with guard:
                    target = _target(h, proc, kind, killed, first_seen)
                    if target is None:
                        continue
                    pid, slot = target
                    killed.add(pid)
                h.kill(kind, pid, job=(slot or {}).get("job"), slot=(slot or {}).get("name"))
                left[kind] -= 1
                due = time.monotonic() + h.rng.uniform(0, spread_seconds)
        accepted = api_clients.accepted
        h.submissions.append(Submission(h.write_jobs([{"id": a["id"], "n": a["n"]} for a in accepted]),
                                        tuple(a["id"] for a in accepted), "accepted"))
        report = h.finish(proc, drain_seconds=120 + len(accepted) * 0.2)
        report.figures.update(api_clients.counts)
        report.figures["jobs_accepted"] = len(accepted)
        report.figures["kills_not_made"] = {k: v for k, v in left.items() if v}
        if api_clients.aimed_left:
            report.figures["kills_not_made"]["api_kill mid-request"] = api_clients.aimed_left
        if api_clients.refusals:
            report.row_failures.append(f"{len(api_clients.refusals)} jobs not accepted: {api_clients.refusals[:3]}")
        wrong_ids = [a for a in accepted if a["id"] != a["key"]]
        if wrong_ids:
            report.row_failures.append(f"{len(wrong_ids)} jobs got another id than their key: {wrong_ids[:3]}")
        return report
    finally:
        h.cleanup()


def _target(h: ChaosRun, proc: Any, kind: str, killed: set[int], first_seen: dict[int, float]
            ) -> tuple[int, dict[str, Any] | None] | None:
    """A process of ``kind`` to kill now, alive at least MIN_LIFE_SECONDS and not killed before."""
    now = time.monotonic()
    if kind == "api_kill":
        api = _api_process(h, proc)
        if api is None or api.pid in killed:
            return None
        return (api.pid, None) if now - first_seen.setdefault(api.pid, now) >= MIN_LIFE_SECONDS else None
    field = "runner_pid" if kind == "runner_kill" else "pid"
    slots = [s for s in h.slots() if s.get(field) and s[field] not in killed and h.age(s[field]) >= MIN_LIFE_SECONDS]
    if not slots:
        return None
    slot = h.rng.choice(slots)
    return slot[field], slot
