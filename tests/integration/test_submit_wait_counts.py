"""``comfysup submit --wait`` once showed 12/12 beside done=10. Every frame of its bar now comes from one
poll: the bar's position is the jobs that ended (done + dead + cancelled), and those with the jobs still running,
posted (waiting in a server's queue) and queued add up to the file's jobs. A runner of this test ends the jobs
while the command waits, ten done and two dead, one queued behind another each time (posted, then running)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
from cli_support import cli, db_path, line, write_config, write_jobs

from comfysup.queue.base import Claim
from comfysup.queue.sqlite import SQLiteQueue

FRAME = re.compile(r"ended:.*?(\d+)/(\d+) .*?done=(\d+), dead=(\d+), cancelled=(\d+), running=(\d+), posted=(\d+), "
                   r"queued=(\d+)")


def _runner(path: Path, jobs: int, stop: threading.Event) -> None:
    """Take the jobs two at a time, the second posted behind the first; the 6th and the 12th go dead."""
    queue = SQLiteQueue(path)
    ended = 0
    try:
        while ended < jobs and not stop.is_set():
            first = queue.leases.claim("host/1/gpu0/t", "gpu0", 60)
            if first is None:
                time.sleep(0.02)  # submit --wait may not have inserted them yet
                continue
            behind = queue.leases.claim("host/1/gpu0/t", "gpu0", 60)
            queue.leases.record_prompt(first, "gpu0", 2 * ended)
            if behind is not None:
                queue.leases.record_prompt(behind, "gpu0", 2 * ended + 1, waiting=True)
            for claim in (first, behind):
                if claim is None:
                    continue
                time.sleep(0.15)  # the pace of a prompt, so that the command's polls see each state
                ended += 1
                _end(queue, claim, ended, behind if claim is first else None)
    finally:
        queue.close()


def _end(queue: SQLiteQueue, claim: Claim, n: int, started: Claim | None) -> None:
    if n % 6 == 0:
        queue.leases.dead(claim, "permanent: ComfyUI refused the prompt")
        if started is not None:
            queue.leases.set_waiting(started, False)
    else:
        queue.leases.complete(claim, [], started=started)


@pytest.mark.timeout(30)
def test_submit_wait_shows_one_set_of_counts_in_every_frame(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path)
    write_jobs(tmp_path, [line(n) for n in range(12)])
    stop = threading.Event()
    runner = threading.Thread(target=_runner, args=(db_path(tmp_path), 12, stop), daemon=True)
    runner.start()
    try:
        code, out, err = cli(capsys, "submit", "--config", str(config), str(tmp_path / "jobs.jsonl"), "--wait")
    finally:
        stop.set()
        runner.join(10)
    assert code == 1, out + err  # two are dead
    assert "summary: 10 done, 2 dead-lettered, 0 cancelled" in out
    frames = [tuple(map(int, m.groups())) for text in re.split(r"[\r\n]", err) if (m := FRAME.search(text))]
    assert frames, err
    for n, total, done, dead, cancelled, running, posted, queued in frames:
        assert total == 12
        assert n == done + dead + cancelled, frames  # the bar moves with the counts beside it
        assert done + dead + cancelled + running + posted + queued == total, frames
        assert running <= 1  # one server: the job behind the running one is counted as posted
    assert frames[-1][:5] == (12, 12, 10, 2, 0)
