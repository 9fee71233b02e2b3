"""The checker: after a chaos run has drained, count everything docs/design.md's promise forbids.

It trusts nothing the system says about itself when there is independent evidence: executions come
from fake_comfy's execution log (written by the servers, across restarts), files are hashed again,
secrets are searched for byte by byte. Counted, as in Jepsen's queue checkers:

- **lost**: an accepted submission that is not terminal (or not in the queue at all); a killed submit
  must have left 0 or all of its file's rows (**partial submit**).
- **double terminal**: more than one terminal attempt record for a job, or more than one terminal log
  line (``done on`` / ``dead-lettered`` / ``cancelled on``), beyond the requeues a person asked for; a
  second set of complete files in a done job's folder (**extra results**).
- **overlapping claims**: two attempts of one job whose [started, ended] overlap in the queue.
- **concurrent executions**: two executions of one job, on any servers, whose [started, ended] overlap.
  An execution cut short by a kill has no end line; it ended when the fault log says its pid was
  killed (else when its port's next server started: an unexplained death, also reported).
- **re-executions**, each matched to what destroyed the run before it: a scripted OOM, crash or hang
  (the timeout), a kill of the server that ran it mid-prompt, a database lock that made the attempt
  stop itself, a timeout recorded in the attempts. Any other is **unmatched**. A run that completed
  (every node ran, its files written: ``success``, or the fake's ``completed`` line before a kill took
  its history) is adopted, never run again: any execution after it is **after completed**. More
  executions or posts than attempts, beyond one more after each run that ran out of memory (POST
  /free and the job posted once more in the same attempt), is an **uncounted** run.
- **missing / partial files**: a ``done`` job whose recorded file is absent or has another size or hash (for an
  output in a bucket: the object at its recorded ``s3://`` location, read back and hashed);
  any file under a final name in the store that is not a complete image; **outside**: anything in the
  store that is not in a job's folder. ``.part`` files are fine (not final) and only counted.
- **leaked secrets**: a canary found anywhere but the job's own stored workflow and extra_data: every
  file under the run's folder (logs, supervisor.json, the store, servers' folders), every other column
  of every table of the queue, and the captured outputs of status, show and results.
- ``PRAGMA integrity_check`` of the queue.

Any lost, partial submit, double terminal, extra results, overlapping claim, concurrent execution,
unmatched re-execution, execution after a completed one, uncounted run, missing or partial file, an output
that is not its input image inverted (``wrong_outputs``, chaos/inverted.py), file outside, leaked secret, a
failed integrity check, or a failure of the scenario's own expectations (``row_failures``) fails the run
(:attr:`Report.ok`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sqlite3
import struct
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.faults import Fault
from chaos.inverted import check_inverted

TERMINAL = ("done", "dead", "cancelled")
KILLS = ("server_kill", "supervisor_kill", "stuck_restart", "power_cut")
"""Faults that kill ComfyUI servers (and so end their executions, and lose their history). A
``stuck_restart`` is the supervisor's own restart of a server whose prompt ignored /interrupt, recorded
when the supervisor said the server was gone: it ends the stuck execution as a kill does. A ``power_cut``
(rows P1, P2) kills every process of the installation, the servers with the rest."""
DEATH_SLACK_SECONDS = 1.0
"""A supervisor's children die of PR_SET_PDEATHSIG a moment after it: a run may still end, and write its
history, in that moment, and the history dies with the server all the same."""
LOCK_SLACK_SECONDS = 1.0
"""An interrupt caused by a database lock lands while the lock is held; this covers the last wake-up."""
TERMINAL_LINE = re.compile(r"job ([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}): (done on|dead-lettered|cancelled on)")
"""A terminal line names the whole job id (ids that share their first 8 characters are common)."""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@dataclass(frozen=True)
class Submission:
    """A jobs file given to ``comfysup submit`` and how that ended: accepted (exit 0), rejected (it said
    which lines were bad), or killed (then the queue must hold 0 or all of its rows)."""

    path: Path
    ids: tuple[str, ...]
    outcome: str


@dataclass
class Evidence:
    """Where a run left its traces."""

    root: Path
    """The run's folder: every file under it is searched for secrets (except ``not_scanned``)."""
    queue_path: Path
    store: Path
    exec_logs: list[Path]
    faults: list[Fault]
    submissions: list[Submission]
    logs: list[Path] = field(default_factory=list)
    """comfysup's own logs (the supervisor's, with its runners'), read for terminal lines."""
    canaries: list[str] = field(default_factory=list)
    fragment_canaries: list[str] = field(default_factory=list)
    """Canaries of random text only, searched for any run of FRAGMENT_CHARS of their characters too: a cut
    that kept half a key is a leak. Also searched whole, like ``canaries``."""
    outputs: dict[str, str] = field(default_factory=dict)
    """Captured command outputs (status, show, results) by name, searched for secrets."""
    not_scanned: list[Path] = field(default_factory=list)
    """The user's own files (jobs files) and the queue's files (searched through SQL instead)."""
    ended_at: float = 0.0
    """When the run was stopped: the end of an execution that never ended."""
    require_terminal: bool = True
    inputs: dict[str, Path] = field(default_factory=dict)
    """Job id → the input image it was submitted with (the user's file): each output of such a job, once
    done, must be that image inverted, pixel for pixel."""
    """False for a run of submits alone (K4): an accepted job is lost only when it is not in the queue."""
    objects: dict[str, bytes] | None = None
    """Row U1: every object in the run's bucket, by ``s3://bucket/key``, read after the run; a done
    job's outputs recorded there are checked against them, byte for byte."""
    announced: set[str] | None = None
    """Rows R1-R3: the job ids whose record arrived on the broker's done or dead exchange (a listener bound to
    both). Each terminal job must be among them: **unannounced** otherwise. Jobs published to the broker
    are given as accepted submissions, so one the consumer never inserted counts as lost."""


@dataclass
class Execution:
    pid: int
    port: int | None
    job: str
    number: Any
    word: str
    cached: bool
    started_at: float
    ended_at: float | None = None
    outcome: str | None = None
    death: str | None = None
    """For an execution without an end line: the fault that killed its server, or how its end was bounded."""
    completed_at: float | None = None
    """When every node had run and its files were written (the fake's ``completed`` line), before its history."""
    machine: int = 0
    """Which execution log it came from: one per machine (row M1 has two). Only the machine whose server
    wrote a run's files can adopt them from its output folder."""

    @property
    def completed(self) -> bool:
        return self.outcome == "success" or self.completed_at is not None

    @property
    def end(self) -> float:
        assert self.ended_at is not None
        return self.ended_at


@dataclass
class Report:
    """The counts; ``ok`` is the verdict. Lists hold examples (job ids and what was seen)."""

    jobs: int = 0
    states: Counter[str] = field(default_factory=Counter)
    attempts: int = 0
    executions: int = 0
    posts: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    partial_submits: list[str] = field(default_factory=list)
    unknown_jobs: list[str] = field(default_factory=list)
    double_terminal: list[str] = field(default_factory=list)
    extra_results: list[str] = field(default_factory=list)
    overlapping_claims: list[str] = field(default_factory=list)
    concurrent: list[str] = field(default_factory=list)
    re_executions: Counter[str] = field(default_factory=Counter)
    unmatched: list[str] = field(default_factory=list)
    after_completed: list[str] = field(default_factory=list)
    """Executions of a job after one of it had completed (its files written): a finished run is adopted, from
    /history or, when the history died with its server, from its files; it is never run again."""
    uncounted: list[str] = field(default_factory=list)
    unexplained_deaths: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    wrong_outputs: list[str] = field(default_factory=list)
    """Outputs of a job with an input image that are not its input inverted (another job's input, a stale
    upload, a cached result of other bytes)."""
    partial_files: list[str] = field(default_factory=list)
    outside_files: list[str] = field(default_factory=list)
    orphan_files: int = 0
    """Complete files in the folder of a job that is not done (a download before a failure): allowed."""
    part_files: int = 0
    leaks: list[str] = field(default_factory=list)
    unannounced: list[str] = field(default_factory=list)
    """Terminal jobs whose record never reached the broker's done or dead exchange (rows R1-R3)."""
    integrity: str = ""
    row_failures: list[str] = field(default_factory=list)
    """What a scenario expects beyond the promise and did not see (a slot failed, a wrong final state, …)."""
    figures: dict[str, Any] = field(default_factory=dict)
    """What a scenario adds about itself (kills that landed mid-prompt, WAL sizes, …)."""

    FAILING = ("lost", "partial_submits", "unknown_jobs", "double_terminal", "extra_results", "overlapping_claims",
               "concurrent", "unmatched", "after_completed", "uncounted", "missing_files", "wrong_outputs",
               "partial_files", "outside_files", "leaks", "unannounced", "row_failures")

    @property
    def ok(self) -> bool:
        return self.integrity == "ok" and not any(getattr(self, name) for name in self.FAILING)

    def violations(self) -> dict[str, list[str]]:
        out = {name: getattr(self, name) for name in self.FAILING if getattr(self, name)}
        if self.integrity != "ok":
            out["integrity"] = [self.integrity]
        return out

    def summary(self) -> str:
        """One line for logs and tables."""
        matched = sum(self.re_executions.values())
        return (f"{self.jobs} jobs ({', '.join(f'{k} {v}' for k, v in sorted(self.states.items()))}), "
                f"{self.executions} executions, {self.attempts} attempts, faults "
                f"{dict(sorted(self.faults.items())) or '{}'}; lost {len(self.lost)}, double terminal "
                f"{len(self.double_terminal)}, concurrent {len(self.concurrent)}, re-executions {matched} matched "
                f"{dict(sorted(self.re_executions.items())) or ''} / {len(self.unmatched)} unmatched, missing "
                f"{len(self.missing_files)}, partial {len(self.partial_files)}, wrong outputs "
                f"{len(self.wrong_outputs)}, leaks {len(self.leaks)}, integrity {self.integrity}")

    def explain(self, limit: int = 8) -> str:
        """The summary and a few examples of each violation, for an assertion message."""
        lines = [f"seed {self.figures.get('seed')}: {self.summary()}"]
        for name, items in self.violations().items():
            lines.append(f"{name} ({len(items)}): " + "; ".join(str(i) for i in items[:limit]))
        if self.unexplained_deaths:
            lines.append(f"unexplained deaths: {self.unexplained_deaths[:limit]}")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        counts = {name: len(getattr(self, name)) for name in self.FAILING}
        return {"ok": self.ok, "jobs": self.jobs, "states": dict(self.states), "attempts": self.attempts,
                "executions": self.executions, "posts": self.posts, "faults": dict(self.faults),
                "re_executions": dict(self.re_executions), "unexplained_deaths": len(self.unexplained_deaths),
                "orphan_files": self.orphan_files, "part_files": self.part_files, "integrity": self.integrity,
                **counts, "figures": self.figures}


# -- reading the evidence ------------------------------------------------------------------------------


@dataclass
class _Job:
    id: str
    state: str
    attempt: int
    outputs: list[dict[str, Any]]
    attempts: list[tuple[float, float | None, str | None, str | None, str]] = field(default_factory=list)
    """(started_at, ended_at, outcome, reason, owner) in claim order."""


def read_queue(path: Path) -> tuple[dict[str, _Job], str, sqlite3.Connection]:
    if not path.exists():  # a power cut took the file, or its folder: every accepted job is lost
        return {}, f"{path} is not there", sqlite3.connect(":memory:")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        integrity = "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
    except sqlite3.DatabaseError as exc:
        integrity = f"{type(exc).__name__}: {exc}"
    if integrity != "ok":
        return {}, integrity, conn  # nothing read from it can be trusted: every accepted job counts as lost
    jobs = {r[0]: _Job(r[0], r[1], r[2], json.loads(r[3]) if r[3] else [])
            for r in conn.execute("SELECT id, state, attempt, outputs FROM jobs")}
    for job_id, started, ended, outcome, reason, owner in conn.execute(
            "SELECT job_id, started_at, ended_at, outcome, reason, owner FROM attempts ORDER BY rowid"):
        if job_id in jobs:
            jobs[job_id].attempts.append((started, ended, outcome, reason, owner))
    return jobs, integrity, conn


def read_executions(paths: Iterable[Path]) -> tuple[list[Execution], Counter[str], dict[int, list[float]]]:
    """Executions from every execution log, posts per job, and the start times of servers per port."""
    runs: dict[tuple[int, Any], Execution] = {}
    posts: Counter[str] = Counter()
    servers: dict[int, list[float]] = defaultdict(list)
    for machine, path in enumerate(paths):
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a kill of its writer: nothing of it happened as far as we know
            kind = event.get("event")
            if kind == "server":
                servers[event["port"]].append(event["started_at"])
            elif kind == "post":
                posts[event["prompt_id"]] += 1
            elif kind == "start":
                runs[(event["pid"], event["number"])] = Execution(
                    pid=event["pid"], port=event.get("port"), job=event["prompt_id"], number=event["number"],
                    word=event.get("word") or "ok", cached=bool(event.get("cached")), started_at=event["started_at"],
                    machine=machine)
            elif kind == "completed":
                run = runs.get((event["pid"], event["number"]))
                if run is not None:
                    run.completed_at = event["completed_at"]
            elif kind == "end":
                run = runs.get((event["pid"], event["number"]))
                if run is not None:
                    run.ended_at, run.outcome = event["ended_at"], event["outcome"]
    for starts in servers.values():
        starts.sort()
    return sorted(runs.values(), key=lambda r: r.started_at), posts, servers


def _bound_deaths(executions: list[Execution], faults: list[Fault], servers: dict[int, list[float]],
                  ended_at: float, report: Report) -> None:
    """Give every execution without an end line the time its server died."""
    for run in executions:
        if run.ended_at is not None:
            continue
        # A supervisor's children outlive it by a moment: a prompt its dying runner had just posted may
        # start in that moment, after the kill was recorded.
        kill = next((f for f in sorted(faults, key=lambda f: f.at)
                     if f.kind in KILLS and run.pid in f.pids and f.at + DEATH_SLACK_SECONDS >= run.started_at), None)
        if kill is not None:
            run.ended_at, run.death = max(kill.at, run.started_at), kill.kind
            continue
        later = [t for t in servers.get(run.port or -1, []) if t > run.started_at]
        run.ended_at = later[0] if later else ended_at
        run.death = "next server start" if later else "end of the run"
        report.unexplained_deaths.append(f"{run.job} on pid {run.pid}: no end, no kill recorded ({run.death})")


def _requeued(previous: Execution, following: Execution, faults: list[Fault]) -> bool:
    """A person asked for the job again between the two runs."""
    return any(fault.kind == "requeue" and previous.job in (fault.detail or {}).get("ids", [])
               and previous.end <= fault.at <= following.started_at for fault in faults)


def _hostile(run: Execution) -> bool:
    """The server garbled its answers about this run (fake_comfy's hostile mode, row H1): whatever the run
    did, the client could not see it, and running the job again is how it gets a result."""
    return run.word.startswith("hostile:") and run.word != "hostile:run:ignore-interrupt"


def _killed_after(run: Execution, faults: list[Fault]) -> str | None:
    """The kind of the kill that took ``run``'s server (and its history) down once the run had begun, if any."""
    return next((f.kind for f in faults
                 if f.kind in KILLS and run.pid in f.pids and f.at + DEATH_SLACK_SECONDS >= run.started_at), None)


def _cause(previous: Execution, following: Execution, job: _Job | None, faults: list[Fault]) -> str | None:
    """What destroyed ``previous`` so that ``following`` had to run the job again; None when nothing did."""
    if _requeued(previous, following, faults):
        return "retry asked by a person"
    if _hostile(previous):
        return "a hostile answer"
    if previous.outcome == "error" and previous.word == "oom":
        return "oom"
    if previous.outcome == "crashed":
        return "crash"
    if previous.outcome is None and previous.death == "stuck_restart":
        return "stuck (server restarted)"
    if previous.outcome is None and previous.death in KILLS:
        return f"{previous.death} mid-prompt"
    if previous.outcome == "interrupted":
        if previous.word == "hang":
            return "timeout (hang)"
        for fault in faults:
            if fault.kind == "db_lock" and fault.at <= previous.end <= (fault.until or fault.at) + LOCK_SLACK_SECONDS:
                return "db_lock"
            if (fault.kind == "db_down" and (fault.detail or {}).get("past_lease")
                    and fault.at <= previous.end <= (fault.until or fault.at) + LOCK_SLACK_SECONDS):
                return "db_down past the lease"  # a shorter outage interrupts nothing: unmatched then
        for started, ended, _outcome, reason, _owner in (job.attempts if job else []):
            if reason and "timed out" in reason and started <= previous.end <= (ended or previous.end) + 1.0:
                return "timeout"
        return None
    return None  # a completed run (success) is never a cause: see Report.after_completed


# -- the checks ------------------------------------------------------------------------------------------


def check(evidence: Evidence) -> Report:
    """Read everything the run left and count; see the module docstring for what each count means."""
    report = Report()
    report.faults = Counter(f.kind for f in evidence.faults)
    jobs, report.integrity, conn = read_queue(evidence.queue_path)
    try:
        _check_submissions(evidence, jobs, report)
        _check_terminals(evidence, jobs, report)
        if evidence.announced is not None:
            heard = evidence.announced
            report.unannounced = sorted(i for i, j in jobs.items() if j.state in TERMINAL and i not in heard)
        executions, posts, servers = read_executions(evidence.exec_logs)
        _bound_deaths(executions, evidence.faults, servers, evidence.ended_at, report)
        _check_executions(executions, posts, jobs, evidence.faults, report)
        _check_store(evidence.store, jobs, report, evidence.objects)
        check_inverted(evidence, jobs, report)
        _check_secrets(evidence, conn, report)
    finally:
        conn.close()
    return report


def _check_submissions(evidence: Evidence, jobs: dict[str, _Job], report: Report) -> None:
    accepted = {i for sub in evidence.submissions if sub.outcome == "accepted" for i in sub.ids}
    for sub in evidence.submissions:
        if sub.outcome == "killed" and all(i in jobs for i in sub.ids):
            accepted.update(sub.ids)  # the kill came after the commit
    for sub in evidence.submissions:
        if sub.outcome == "accepted":
            continue
        # Rows of a rejected or killed file that no accepted file explains: part of a file went in.
        stray = [i for i in sub.ids if i in jobs and i not in accepted]
        if stray:
            report.partial_submits.append(f"{sub.path.name}: {sub.outcome}, yet {len(stray)} of {len(sub.ids)} "
                                          "rows are in the queue")
    known = {i for sub in evidence.submissions for i in sub.ids}
    report.unknown_jobs = sorted(set(jobs) - known)
    report.jobs = len(accepted)
    for job_id in sorted(accepted):
        job = jobs.get(job_id)
        if job is None:
            report.lost.append(f"{job_id}: accepted, not in the queue")
            continue
        report.states[job.state] += 1
        report.attempts += len(job.attempts)
        if job.state not in TERMINAL and evidence.require_terminal:
            report.lost.append(f"{job_id}: {job.state} after the run drained")


def _check_terminals(evidence: Evidence, jobs: dict[str, _Job], report: Report) -> None:
    requeued: Counter[str] = Counter()
    for fault in evidence.faults:
        if fault.kind == "requeue":
            requeued.update((fault.detail or {}).get("ids", []))
    lines: Counter[str] = Counter()
    for log in evidence.logs:
        if log.exists():
            lines.update(m.group(1) for m in TERMINAL_LINE.finditer(log.read_text(errors="replace")))
    for job_id, job in jobs.items():
        allowed = 1 + requeued[job_id]
        terminal = [a for a in job.attempts if a[2] in TERMINAL]
        if len(terminal) > allowed:
            report.double_terminal.append(f"{job_id}: {len(terminal)} terminal attempts "
                                          f"({', '.join(str(a[2]) for a in terminal)})")
        elif lines[job_id] > allowed:
            report.double_terminal.append(f"{job_id}: {lines[job_id]} terminal log lines")
        ordered = sorted(job.attempts, key=lambda a: a[0])
        for before, after in itertools.pairwise(ordered):
            if before[1] is None or after[0] < before[1]:
                report.overlapping_claims.append(
                    f"{job_id}: attempt of {after[4]} claimed at {after[0]:.3f} while {before[4]}'s "
                    f"({before[2]}) ran until {before[1]}")


def _check_executions(executions: list[Execution], posts: Counter[str], jobs: dict[str, _Job],
                      faults: list[Fault], report: Report) -> None:
    by_job: dict[str, list[Execution]] = defaultdict(list)
    for run in executions:
        if run.job in jobs:  # fake-busy-* and other clients' prompts are not ours
            by_job[run.job].append(run)
    report.executions = sum(len(v) for v in by_job.values())
    report.posts = sum(n for job_id, n in posts.items() if job_id in jobs)
    for job_id, runs in by_job.items():
        runs.sort(key=lambda r: r.started_at)
        for i, run in enumerate(runs):
            for other in runs[i + 1:]:
                if other.started_at < run.end:
                    report.concurrent.append(
                        f"{job_id}: pid {run.pid} [{run.started_at:.3f}, {run.end:.3f}] ({run.outcome or run.death}) "
                        f"and pid {other.pid} from {other.started_at:.3f}")
        for previous, following in itertools.pairwise(runs):
            killed = _killed_after(previous, faults)
            if previous.completed and killed and following.machine != previous.machine:
                # Its server died with the history before it was read, and the job went to another machine,
                # which cannot see the files in the dead one's output folder: running it again is the only way.
                report.re_executions[f"{killed} after the run (taken over by another machine)"] += 1
                continue
            if previous.completed and not _requeued(previous, following, faults) and not _hostile(previous):
                report.after_completed.append(
                    f"{job_id}: run on pid {previous.pid} completed at {previous.completed_at or previous.end:.3f} "
                    f"({previous.outcome or previous.death}), then executed again on pid {following.pid}")
                continue
            cause = _cause(previous, following, jobs.get(job_id), faults)
            if cause is None:
                how = previous.outcome or previous.death
                report.unmatched.append(f"{job_id}: run on pid {previous.pid} ended {how} ({previous.word}), "
                                        f"then again on pid {following.pid}")
            else:
                report.re_executions[cause] += 1
        attempts, ooms = len(jobs[job_id].attempts), sum(1 for run in runs if run.word == "oom")
        if max(len(runs), posts[job_id]) > attempts + ooms:
            report.uncounted.append(f"{job_id}: {len(runs)} executions, {posts[job_id]} posts, {attempts} attempts"
                                    + (f" and {ooms} OOM run(s)" if ooms else ""))


def complete_png(data: bytes) -> bool:
    """A whole PNG: the signature, chunks whose CRCs match, and IEND as the very last chunk."""
    if not data.startswith(PNG_MAGIC):
        return False
    at = len(PNG_MAGIC)
    while at + 12 <= len(data):
        (length,) = struct.unpack(">I", data[at:at + 4])
        kind = data[at + 4:at + 8]
        end = at + 12 + length
        if end > len(data):
            return False
        (crc,) = struct.unpack(">I", data[end - 4:end])
        if zlib.crc32(data[at + 4:end - 4]) != crc:
            return False
        if kind == b"IEND":
            return end == len(data)
        at = end
    return False


def _check_store(store: Path, jobs: dict[str, _Job], report: Report,
                 objects: dict[str, bytes] | None = None) -> None:
    recorded: dict[Path, dict[str, Any]] = {}
    for job in jobs.values():
        if job.state != "done":
            continue
        if not job.outputs:
            report.missing_files.append(f"{job.id}: done with no files recorded")
        for out in job.outputs:
            if str(out.get("path", "")).startswith("s3://"):
                _check_object(job.id, out, objects or {}, report)
                continue
            path = store / job.id / out["name"]
            recorded[path] = out
            if not path.is_file():
                report.missing_files.append(f"{job.id}: {out['name']} recorded, not in the store")
                continue
            data = path.read_bytes()
            if len(data) != out["size"] or hashlib.sha256(data).hexdigest() != out["sha256"]:
                report.partial_files.append(f"{job.id}: {out['name']} is {len(data)} bytes, not the recorded "
                                            f"{out['size']} with its hash")
    if not store.exists():
        return
    for path in sorted(p for p in store.rglob("*") if not p.is_dir()):
        relative = path.relative_to(store)
        if len(relative.parts) < 2 or relative.parts[0] not in jobs:
            report.outside_files.append(str(relative))
            continue
        if path.name.startswith(".") and path.name.endswith(".part"):
            report.part_files += 1
            continue
        if path in recorded:
            continue
        job = jobs[relative.parts[0]]
        if not complete_png(path.read_bytes()):
            report.partial_files.append(f"{relative}: under a final name and not a complete image")
        elif job.state == "done" and job.outputs and all(str(o.get("path", "")).startswith("s3://")
                                                         for o in job.outputs):
            # A done job's outputs are in the bucket: a file in its staging folder is a staged copy whose removal a
            # power cut undid (not synced), not a second result. Counted: the staging folder holds it for nothing.
            report.figures["staging_leftovers"] = report.figures.get("staging_leftovers", 0) + 1
        elif job.state == "done":
            report.extra_results.append(f"{relative}: complete, in a done job's folder, not in its record")
        else:
            report.orphan_files += 1


def _check_object(job_id: str, out: dict[str, Any], objects: dict[str, bytes], report: Report) -> None:
    """An output recorded in a bucket: the object is there, with the recorded size and sha256."""
    data = objects.get(out["path"])
    if data is None:
        report.missing_files.append(f"{job_id}: {out['path']} recorded, not in the bucket")
    elif len(data) != out["size"] or hashlib.sha256(data).hexdigest() != out["sha256"]:
        report.partial_files.append(f"{job_id}: {out['path']} is {len(data)} bytes, not the recorded {out['size']} "
                                    "with its hash")
    else:
        report.figures["objects_checked"] = report.figures.get("objects_checked", 0) + 1


FRAGMENT_CHARS = 8


def _needles(evidence: Evidence) -> list[str]:
    """Each canary, and every run of FRAGMENT_CHARS characters of each fragment canary."""
    out = list(dict.fromkeys([*evidence.canaries, *evidence.fragment_canaries]))
    for canary in evidence.fragment_canaries:
        out += [canary[i:i + FRAGMENT_CHARS] for i in range(len(canary) - FRAGMENT_CHARS + 1)]
    return list(dict.fromkeys(out))


def _check_secrets(evidence: Evidence, conn: sqlite3.Connection, report: Report) -> None:
    needles = _needles(evidence)
    if not needles:
        return
    canaries = [c.encode() for c in needles]
    skip = {p.resolve() for p in evidence.not_scanned}
    queue = evidence.queue_path.resolve()
    skip |= {queue, queue.with_name(queue.name + "-wal"), queue.with_name(queue.name + "-shm"),
             queue.with_name(queue.name + "-journal")}
    for path in sorted(evidence.root.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.resolve() not in skip:
            data = path.read_bytes()
            for canary in canaries:
                if canary in data:
                    report.leaks.append(f"{path.relative_to(evidence.root)}")
    for name, text in evidence.outputs.items():
        if any(c in text for c in needles):
            report.leaks.append(f"output of {name}")
    if report.integrity != "ok":
        return  # a damaged queue is already a failure, and its rows cannot be read
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for table in tables:
        columns = [r[1] for r in conn.execute(f"PRAGMA table_info({table})")]
        for column in columns:
            if (table, column) in (("job_specs", "workflow"), ("job_specs", "extra_data"), ("workflows", "workflow")):
                continue  # the job's own stored workflow (once per distinct text since v5): where the secret belongs
            for canary in needles:
                n = conn.execute(f"SELECT count(*) FROM {table} WHERE instr(CAST({column} AS TEXT), ?) > 0",
                                 (canary,)).fetchone()[0]
                if n:
                    report.leaks.append(f"queue {table}.{column}: {n} row(s)")
