"""Machines sharing one queue: their names, the supervisor's registration and heartbeat, what `status` shows,
and a supervisor whose database stops answering."""

from __future__ import annotations

import json
import logging
import os
import re
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tomli_w

from comfysup.cli import main as cli
from comfysup.commands.status import MACHINE_STALE_SECONDS, render_machines
from comfysup.config import load_config
from comfysup.errors import DatabaseUnavailable
from comfysup.queue.base import HOSTNAME_VARIABLE, Machine, host_name
from comfysup.queue.db import Role
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.loop import make_owner
from comfysup.supervisor.supervisor import Supervisor


def test_comfysup_hostname_names_the_machine_in_owners(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOSTNAME_VARIABLE, "machine-b")
    assert host_name() == "machine-b"
    assert make_owner("gpu0", 123, "abcd").startswith("machine-b/123/gpu0/")
    monkeypatch.setenv(HOSTNAME_VARIABLE, "rack/7")
    assert host_name() == "rack-7"  # a slash would split the owner token
    monkeypatch.delenv(HOSTNAME_VARIABLE)
    assert host_name() == os.uname().nodename


def test_comfysup_hostname_is_not_taken_for_an_unknown_setting(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[queue]\npath = "q.db"\n')
    config = load_config(str(path), env={"COMFYSUP_HOSTNAME": "machine-b", "COMFYSUP_RUNNER_ATTEMPTS": "3"})
    assert config.runner.attempts == 3


class FakeOps:
    """No processes: forks and spawns hand out made-up pids, signals are recorded."""

    def __init__(self) -> None:
        self.next_pid = 4_000_000
        self.killed: list[tuple[int, int]] = []

    def spawn(self, argv: Any, *, env: Any, log_path: Path, cwd: str | None = None) -> int:
        self.next_pid += 1
        return self.next_pid

    def fork(self, child: Any) -> int:
        self.next_pid += 1
        return self.next_pid

    def kill(self, pid: int, sig: int) -> bool:
        self.killed.append((pid, sig))
        return True

    def killpg(self, pgid: int, sig: int) -> bool:
        return self.kill(pgid, sig)

    def reap(self) -> list[tuple[int, int]]:
        return []


class FlakyQueue:
    """A queue in front of a real one whose database can be made to stop answering."""

    def __init__(self, inner: SQLiteQueue) -> None:
        self.inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Any:
        return self._flaky(getattr(self.inner, name))

    def _flaky(self, attr: Any) -> Any:
        if isinstance(attr, Role):  # a role of the queue: its calls fail with the rest
            return SimpleNamespace(**{n: self._flaky(getattr(attr, n)) for n in dir(attr) if not n.startswith("_")})
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise DatabaseUnavailable("postgresql://db:5432/q: the database does not answer: connection refused")
            return attr(*args, **kwargs)

        return call


def supervisor_of(tmp_path: Path) -> tuple[Supervisor, SQLiteQueue]:
    """A supervisor of two external servers (nothing is launched), with its queue open."""
    doc = {"queue": {"path": str(tmp_path / "var" / "queue.db")}, "store": {"dir": str(tmp_path / "store")},
           "comfyui": {"gpus": "cpu:1"},
           "servers": [{"name": "remote0", "url": "http://127.0.0.1:9"}, {"name": "remote1", "url": "http://127.0.0.1:9"}]}
    path = tmp_path / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    sup = Supervisor(load_config(str(path), env={}), ops=FakeOps(), env={})  # type: ignore[arg-type]
    sup.units = [u for u in sup.build_units() if u.plan is None]
    queue = SQLiteQueue(tmp_path / "var" / "queue.db")
    return sup, queue


def test_the_supervisor_registers_its_machine_and_heartbeats_its_slots(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HOSTNAME_VARIABLE, "machine-a")
    sup, queue = supervisor_of(tmp_path)
    sup.queue = queue
    sup.heartbeat_machine(register=True)
    [machine] = queue.fleet.machines()
    assert (machine.host, machine.pid) == ("machine-a", os.getpid())
    assert [s["name"] for s in machine.slots] == ["remote0", "remote1"]
    assert machine.age_seconds < 5
    sup.tick(sup.clock())  # forks the runners (made up) and heartbeats with their pids
    [machine] = queue.fleet.machines()
    assert all(s["runner_pid"] for s in machine.slots)
    queue.close()


@pytest.mark.timeout(20)
def test_a_write_lock_held_elsewhere_skips_the_machine_heartbeat_instead_of_holding_the_loop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner stopped in the middle of a transaction (SIGSTOP, a debugger) holds SQLite's write lock: the
    supervisor's heartbeat of its machine row waits half a second, not the queue's 30 s, so its loop goes on to
    kill that silent runner; the beat is skipped, and the queue is not called down for it."""
    monkeypatch.setenv(HOSTNAME_VARIABLE, "machine-a")
    sup, queue = supervisor_of(tmp_path)
    sup.queue = queue
    sup.heartbeat_machine(register=True)
    [before] = queue.fleet.machines()
    holder = sqlite3.connect(tmp_path / "var" / "queue.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the stopped runner's transaction
    try:
        sup.heartbeat_machine()  # the queue's busy timeout is 30 s: past this test's timeout
        assert sup.queue_ok
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    sup.heartbeat_machine()
    [after] = queue.fleet.machines()
    assert after.heartbeat_at > before.heartbeat_at  # the lock gone, the next beat is written
    queue.close()


def test_a_supervisor_whose_database_stops_answering_stops_claiming_and_says_so(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sup, queue = supervisor_of(tmp_path)
    flaky = FlakyQueue(queue)
    sup.queue = flaky  # type: ignore[assignment]
    sup.tick(sup.clock())
    assert [u.shared.may_claim for u in sup.units] == [1, 1]
    flaky.down = True
    caplog.set_level(logging.INFO, logger="comfysup.supervisor")
    for _ in range(3):
        sup._next_housekeeping = 0.0  # the heartbeat is due (every HOUSEKEEPING_SECONDS)
        sup.tick(sup.clock())
        assert [u.shared.may_claim for u in sup.units] == [0, 0]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # said once, not every few seconds
    assert "the queue database does not answer" in errors[0] and "stop claiming" in errors[0]
    # A runner dies while the database is away: the supervisor logs it and goes on.
    unit = sup.units[0]
    pid = unit.runner_pid
    assert pid is not None
    sup._runner_exited(unit, sup.clock(), "exit code 1")
    assert any("cannot release the claims" in r.getMessage() for r in caplog.records)
    flaky.down = False
    sup._next_housekeeping = 0.0
    sup.tick(sup.clock())
    assert sup.units[1].shared.may_claim == 1
    assert any("answers again" in r.getMessage() for r in caplog.records)
    queue.close()


def test_status_shows_every_machine_and_marks_the_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    queue = SQLiteQueue(tmp_path / "q.db")
    now = time.time()
    queue.fleet.register_machine("machine-a", 11, [{"name": "gpu0", "device": "cuda:0", "state": "running",
                                              "job": "0000-job"}], now=now - 2)
    queue.fleet.register_machine("machine-b", 22, [{"name": "gpu0", "device": "cuda:0", "state": "running"}],
                           now=now - MACHINE_STALE_SECONDS - 40)
    queue.close()
    assert cli(["status", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "machines sharing this queue: 2" in out
    a_line = next(line for line in out.splitlines() if "machine-a" in line)
    b_line = next(line for line in out.splitlines() if "machine-b" in line)
    assert "STALE" not in a_line
    assert re.search(r"heartbeat 2\.\d s ago", a_line)
    assert "STALE: no heartbeat for 1 min" in b_line
    assert "0000-job" in out
    assert cli(["status", "--json", "--config", str(config)]) == 0
    machines = json.loads(capsys.readouterr().out)["machines"]
    assert [(m["host"], m["stale"]) for m in machines] == [("machine-a", False), ("machine-b", True)]


def test_render_machines_survives_odd_slots() -> None:
    text = render_machines([Machine("m", 1, ["not a dict", {"name": None}], 0.0, 0.0, 1.0)])  # type: ignore[list-item]
    assert text.splitlines()[1].startswith("  m (supervisor pid 1")
