"""Under ``comfysup run``: a prompt that ignores /interrupt (fake_comfy's
``hostile:run:ignore-interrupt``, a custom node that never checks the flag) makes the supervisor restart
its server; the attempt ends as a transient ``stuck`` failure, retried or dead-lettered with that reason,
and the slot carries on (never marked failed for it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from supervisor_support import Supervised, job, job_id, wait_for

STUCK = "hostile:run:ignore-interrupt"


@pytest.mark.timeout(120)
def test_a_stuck_prompt_restarts_its_server_and_the_job_is_retried_or_dead_lettered(harness: list[Supervised],
                                                                                    tmp_path: Path) -> None:
    retried, dead = job_id(0), job_id(1)
    h = Supervised(tmp_path, script={retried: [STUCK, "ok"], dead: [STUCK, STUCK]}, node_ms=20,
                   runner={"timeout_seconds": 2.0, "leave_queue_seconds": 1.0, "attempts": 2})
    harness.append(h)
    ids = h.submit([job(n) for n in range(4)])
    proc = h.start()
    jobs = h.wait_terminal(ids, 90)
    assert jobs[retried].state == "done", h.describe()
    first = jobs[retried].attempts[0]
    assert (first.outcome, first.kind) == ("retry", "stuck"), first
    assert first.reason is not None and "did not leave" in first.reason and "the server was restarted" in first.reason
    assert f"{first.server}'s queue within 1 s of /interrupt" in first.reason
    # Two counted attempts; on a loaded machine a claim may also be given back uncounted in between (its server
    # out of service while its stuck prompt is waited out), which is no attempt of the job's.
    counted = [a for a in jobs[dead].attempts if not (a.outcome or "").startswith("released")]
    assert jobs[dead].state == "dead" and len(counted) == 2, (jobs[dead].attempts, h.describe())
    assert jobs[dead].reason is not None and jobs[dead].reason.startswith("gave up after 2 attempts, last: "
                                                                                   "the prompt did not leave")
    assert {jobs[job_id(n)].state for n in (2, 3)} == {"done"}

    def settled() -> list[dict[str, object]] | None:
        state = h.state()
        slots = (state or {}).get("slots") or []
        ok = all(s["state"] == "running" and not s["out_of_service"] for s in slots)
        return slots if ok and sum(s["stuck_restarts"] for s in slots) == 3 else None

    slots = wait_for(settled, 20, "three restarts of stuck servers, every slot running again", h.describe)
    assert sum(s["restarts"] for s in slots) == 3, "each stuck prompt restarted its server once, no other restart"
    assert h.log().count("did not leave ComfyUI's queue after /interrupt") == 3
    assert h.stop(proc) == 0
