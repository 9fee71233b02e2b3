"""One set of counts. A job queued ahead waits as posted; its wait in ComfyUI's queue and its run are
two figures; submit --wait's bar and its counts come from one poll and add up."""

from __future__ import annotations

from comfysup.api import views
from comfysup.commands.submit import wait_counts
from comfysup.queue.base import Attempt, JobPulse, JobRecord
from comfysup.runner.trace import Trace, figures

T0 = 1_700_000_000.0
WORKFLOW = {"1": {"class_type": "EmptyImage", "inputs": {}}, "2": {"class_type": "SaveImage", "inputs": {}}}


def queued_ahead_trace() -> Trace:
    """Claimed at 0 and posted at 0.1 behind a prompt that ran until 5.1, executed until 7.1, recorded at 7.5."""
    trace = Trace.start(WORKFLOW, T0)
    trace.phase("posted", T0 + 0.1)
    trace.on_event("execution_start", {}, T0 + 5.1)
    trace.on_event("executing", {"node": "1"}, T0 + 5.2)
    trace.phase("downloading", T0 + 7.1)
    trace.phase("recorded", T0 + 7.5)
    return trace


def test_the_wait_in_comfyuis_queue_is_not_part_of_the_run() -> None:
    stored = queued_ahead_trace().as_dict()
    wait, run = figures(stored)
    assert round(wait, 6) == 5.0  # from its POST to its execution_start
    assert round(run, 6) == 2.5  # claim to POST (0.1) and execution_start to the end (2.4): never the wait
    assert (stored["comfyui_wait_s"], stored["run_s"]) == (round(wait, 6), round(run, 6))  # what metrics read


def test_an_attempt_that_never_started_waited_all_along_and_one_not_posted_did_not_wait() -> None:
    withdrawn = Trace.start(WORKFLOW, T0)
    withdrawn.phase("posted", T0 + 0.5)
    withdrawn.phase("recorded", T0 + 3.5)  # taken out of the server's queue before it started
    assert figures(withdrawn.as_dict()) == (3.0, 0.5)
    adopted = Trace.start(WORKFLOW, T0)
    adopted.phase("adopted", T0 + 0.2)
    adopted.phase("recorded", T0 + 1.0)
    assert figures(adopted.as_dict()) == (0.0, 1.0)
    assert figures(None) == (0.0, None)  # no trace: its runner died, nothing to measure


def test_the_bar_counts_add_up_to_the_files_jobs() -> None:
    ended = {"a": "done", "b": "done", "c": "dead"}
    left = ["d", "e", "f", "g", "h", "i"]
    states = {"a": "done", "b": "done", "c": "dead", "d": "running", "e": "posted", "f": "queued",
              "i": "storing"}  # g, h unknown
    counts = wait_counts(ended, states, left)
    assert counts == {"done": 2, "dead": 1, "cancelled": 0, "running": 1, "posted": 1, "storing": 1, "queued": 3}
    assert counts["done"] + counts["dead"] + counts["cancelled"] == len(ended)  # the bar's position
    assert sum(counts.values()) == len(ended) + len(left)  # the bar's total


def record(state: str, waiting_since: float | None = None, attempts: list[Attempt] | None = None,
           finished_at: float | None = None) -> JobRecord:
    return JobRecord(id="0f6a8e3e-5b7a-4a8c-9d7e-3f3c2a1b0c9d", state=state, priority=0, attempt=1, workflow=WORKFLOW,
                     extra_data={}, meta={}, params={}, workflow_name="w", submitted_at=T0, run_after=0.0,
                     owner="h/1/gpu0/t", server="gpu0", lease_until=T0 + 60, started_at=T0 + 1.0,
                     finished_at=finished_at, reason=None, outputs=[], cancel_requested=False,
                     attempts=attempts or [], waiting_since=waiting_since)


def test_the_api_shows_a_posted_job_queued_with_its_place_and_a_running_one_without() -> None:
    posted = views.job(record("running", waiting_since=T0 + 1.1), "http://api", T0 + 2, queue_position=1)
    assert (posted["status"], posted["queue_position"], posted["started_at"]) == ("queued", 1, None)
    running = views.job(record("running"), "http://api", T0 + 2, queue_position=1)
    assert (running["status"], running["queue_position"]) == ("running", None)
    assert record("running", waiting_since=T0).shown_state == "posted" and record("running").shown_state == "running"
    pulse = JobPulse("x", "running", 1, False, None, waiting_since=T0)
    assert views.status(pulse) == "queued"  # the event stream says running only once it executes


def test_the_apis_metrics_count_the_wait_in_comfyuis_queue_as_queueing() -> None:
    trace = queued_ahead_trace().as_dict()
    attempt = Attempt(1, "h/1/gpu0/t", "gpu0", T0 + 1.0, T0 + 8.5, "done", None, 2, trace=trace)
    body = views.job(record("done", attempts=[attempt], finished_at=T0 + 8.5), "http://api", T0 + 9)
    assert body["metrics"] == {"queue_ms": 6000, "execution_ms": 2500}  # 1 s to its claim + 5 s behind another
