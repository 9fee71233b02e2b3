"""Machines whose ComfyUI servers are managed elsewhere (``comfysup work``).

7. Two machines share a PostgreSQL queue, each with its own server, both named gpu0. Machine A's ``work``
   is killed with ``kill -9`` mid-prompt while its server goes on running the prompt. Machine B takes the
   claim over when the lease expires and must find the job on A's server (by the URL A's attempt recorded),
   not run it again on its own: 0 double executions.
4. ``kill -9`` of ``comfysup work`` takes its runner processes with it, so starting ``work`` again never
   puts two runners on one server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
import tomli_w
from pg_support import pg_url  # noqa: F401  (a fixture)
from supervisor_support import wait_for

from comfysup.comfy import ComfyClient
from comfysup.queue import open_queue
from fake_comfy import FakeComfy
from tests.runner_helpers import ROOT, comfysup, config_of, jobs_file, trivial_job, write_config


def work(config: Path, server: str, host: str, log: Path, *more: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "comfysup", "work", "--config", str(config), "--server", server,
                             *more], stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "COMFYSUP_HOSTNAME": host}, start_new_session=True)


def runners_of(proc: subprocess.Popen, config: Path) -> list[psutil.Process]:
    """The children of a ``work`` once its loop runs (its work.json names its pid): its signal handlers are
    installed by then. Any child alone would do for the count, but a SIGTERM sent at the first child (a
    helper process of an import, say) can land before the handlers and kill ``work`` outright."""
    from comfysup.commands.work import work_state_path
    from comfysup.config import load_config

    state_file = work_state_path(load_config(str(config), env={}))

    def ready() -> list[psutil.Process] | None:
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            return None
        if state.get("pid") != proc.pid or state.get("state") != "running":
            return None
        return psutil.Process(proc.pid).children(recursive=True) or None

    return wait_for(ready, 20, "work's loop and its runner")


def kill_all(processes: list[psutil.Process]) -> None:
    """Runners that outlived their ``work`` (a regression): killed, so no test leaves one behind."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


def pg_config(folder: Path, url: str) -> Path:
    folder.mkdir()
    doc = {"queue": {"url": url}, "store": {"dir": str(folder / "store")}, "comfyui": {"gpus": "cpu:1"},
           "runner": {"attempts": 2, "base_delay_seconds": 0.05, "max_delay_seconds": 0.2, "jitter": False,
                      "timeout_seconds": 30.0, "poll_seconds": 0.2, "lease_seconds": 2.0,
                      "heartbeat_seconds": 0.4, "http_timeout_seconds": 5.0}}
    path = folder / "config.toml"
    path.write_bytes(tomli_w.dumps(doc).encode())
    return path


def executing(url: str) -> str | None:
    running = [e for e in ComfyClient(url, timeout_seconds=2).queue() if e.running]
    return running[0].prompt_id if running else None


@pytest.mark.timeout(120)
@pytest.mark.parametrize("moment", ["mid-prompt", "at-the-post-behind-it"])
def test_a_claim_taken_over_from_a_killed_machine_follows_the_run_on_its_server(
        tmp_path: Path, pg_url: str, moment: str) -> None:  # noqa: F811
    """``at-the-post-behind-it``: A dies as its server takes the POST of the job queued behind the running
    one ([runner] queue_ahead), before A could record that prompt: B finds it by the URL A's claim named."""
    # About 3 s a job on A's server: the run outlives A's lease (2 s), so B finds it still running there.
    with FakeComfy(base_directory=tmp_path / "fake-a", node_ms=1000) as a, \
            FakeComfy(base_directory=tmp_path / "fake-b", node_ms=20) as b:
        config_a, config_b = pg_config(tmp_path / "machine-a", pg_url), pg_config(tmp_path / "machine-b", pg_url)
        jobs = [trivial_job(n) for n in range(1, 4)]
        out = comfysup("submit", str(jobs_file(tmp_path, jobs)), "--config", str(config_a))
        assert out.returncode == 0, out.stderr
        killed = threading.Event()
        if moment == "at-the-post-behind-it":
            posted = a.recorder.posted

            def kill_machine_a(prompt_id: str, word: str) -> dict[str, Any]:
                if prompt_id == jobs[1]["id"] and not killed.is_set():
                    # work and its runner (its own process group) at once: the POST is never seen answered
                    for process in [*psutil.Process(proc_a.pid).children(recursive=True), psutil.Process(proc_a.pid)]:
                        process.send_signal(signal.SIGKILL)
                    killed.set()
                return posted(prompt_id, word)

            a.recorder.posted = kill_machine_a  # type: ignore[method-assign]
        proc_a = work(config_a, f"gpu0={a.url}", "machine-a", tmp_path / "a.log")
        runners: list[psutil.Process] = []
        try:
            cut = wait_for(lambda: executing(a.url), 30, "machine-a's server to run a job")
            runners = psutil.Process(proc_a.pid).children(recursive=True)
            if moment == "at-the-post-behind-it":
                assert killed.wait(30), "machine-a posted no job behind the running one"
            os.kill(proc_a.pid, signal.SIGKILL)  # the machine dies; its server, managed elsewhere, goes on
            proc_a.wait(10)
            wait_for(lambda: not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in runners), 5,
                     "machine-a's runners to die with it")
            assert executing(a.url) == cut, "A's server still runs the job cut short"
            proc_b = work(config_b, f"gpu0={b.url}", "machine-b", tmp_path / "b.log", "--until-empty")
            assert proc_b.wait(60) == 0, (tmp_path / "b.log").read_text()
        finally:
            if proc_a.poll() is None:
                proc_a.kill()
            kill_all(runners)
        queue = open_queue(config_of(config_b))
        try:
            records = {j["id"]: queue.reads.get(j["id"]) for j in jobs}
        finally:
            queue.close()
        log_b = (tmp_path / "b.log").read_text()
        assert {r.state for r in records.values()} == {"done"}, log_b
        stats_a, stats_b = a.stats()["prompts"], b.stats()["prompts"]
        for job_id in records:
            runs = stats_a.get(job_id, {}).get("executed", 0) + stats_b.get(job_id, {}).get("executed", 0)
            assert runs == 1, (job_id, stats_a.get(job_id), stats_b.get(job_id), log_b)
        assert stats_b.get(cut, {}).get("posted", 0) == 0, "the job cut short was posted again on B's server"
        if moment == "at-the-post-behind-it":
            behind = jobs[1]["id"]
            assert stats_a[behind]["posted"] == 1 and stats_b.get(behind, {}).get("posted", 0) == 0, \
                "the job whose POST A never saw answered was posted again on B's server"
        assert records[cut].attempt == 2 and records[cut].attempts[-1].owner.startswith("machine-b/")
        assert f"job {cut} attempt 2 on gpu0: following prompt" in log_b or "adopting" in log_b, log_b


@pytest.mark.timeout(60)
def test_kill_9_of_work_takes_its_runners_with_it(tmp_path: Path) -> None:
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        config = write_config(tmp_path)
        first = work(config, f"a={fake.url}", "host", tmp_path / "first.log")
        runners: list[psutil.Process] = []
        try:
            runners = runners_of(first, config)
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
            wait_for(lambda: not any(r.is_running() and r.status() != psutil.STATUS_ZOMBIE for r in runners), 5,
                     f"the runners {[r.pid for r in runners]} to die with `work`")
            second = work(config, f"a={fake.url}", "host", tmp_path / "second.log")
            try:
                again = runners_of(second, config)
                assert len(again) == len(runners) == 1  # one runner on the server, not two
            finally:
                second.send_signal(signal.SIGTERM)
                assert second.wait(20) == 0
        finally:
            if first.poll() is None:
                first.kill()
            kill_all(runners)


@pytest.mark.timeout(90)
def test_work_on_a_fresh_queue_starts_every_time(tmp_path: Path) -> None:
    """The queue's file is made before the runners fork: made by a runner and `work` at once, the loser met
    the winner's lock and `work` exited 1, "database is locked", now and then on a fresh queue."""
    with FakeComfy(base_directory=tmp_path / "fake", node_ms=5) as fake:
        for i in range(6):
            folder = tmp_path / f"run{i}"
            folder.mkdir()
            config = write_config(folder)
            proc = work(config, f"a={fake.url}", "host", folder / "work.log")
            try:
                wait_for(lambda proc=proc, folder=folder: (folder / "work.json").exists() or proc.poll() is not None,
                         20, "work to run its loop or exit")
                assert proc.poll() is None, (folder / "work.log").read_text()
            finally:
                proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, (folder / "work.log").read_text()
