"""An Attempt lives one attempt and returns what happened as a value: its outcome, and the next job it
claimed for the runner (with that job's prompt when the hand-off posted it already)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from comfysup.config import Config, RunnerConfig
from comfysup.queue.base import Claim
from comfysup.runner import attempt as attempt_module
from comfysup.runner.attempt import ALARM_SLACK_SECONDS, Attempt
from comfysup.runner.result import AheadAsks, ClaimArgs, Outcome
from comfysup.runner.station import AttemptSettings, Station
from comfysup.runner.store import ResultStore
from comfysup.runner.stuck import StuckChannel
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, job_id, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=2)
    server.start()
    yield server
    server.stop()


def test_attempt_settings_have_no_defaults_of_their_own() -> None:
    """[runner]'s declarations in comfysup.config are the only place a default is written."""
    with pytest.raises(TypeError):
        AttemptSettings(server="cpu0", url="http://x")  # type: ignore[call-arg]
    s = AttemptSettings.from_config(Config(), "cpu0", "http://x", {"cpu0": "http://x", "cpu1": "http://y"})
    r = RunnerConfig()
    assert (s.policy.attempts, s.policy.base_delay_seconds, s.policy.max_delay_seconds, s.policy.jitter) == \
        (r.attempts, r.base_delay_seconds, r.max_delay_seconds, r.jitter)
    assert (s.timeout_seconds, s.poll_seconds, s.lease_seconds, s.heartbeat_seconds, s.http_timeout_seconds) == \
        (r.timeout_seconds, r.poll_seconds, r.lease_seconds, r.heartbeat_seconds, r.http_timeout_seconds)
    assert s.peers == {"cpu1": "http://y"}  # not itself


@pytest.mark.timeout(60)
def test_the_next_claim_and_its_posted_prompt_come_back_as_values(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path)
    queue = submit(config, [trivial_job(1), trivial_job(2), trivial_job(3)])
    station = Station(AttemptSettings.from_config(config_of(config), "cpu0", fake.url, {}), queue,
                      ResultStore(tmp_path / "store", 1 << 30))
    asked: list[tuple[str, Outcome]] = []

    def next_job(claim: Claim, outcome: Outcome) -> ClaimArgs | None:
        asked.append((claim.id, dataclasses.replace(outcome)))
        return ClaimArgs("runner-a", "cpu0", 30, claim.model_key, 0)

    first = queue.leases.claim("runner-a", "cpu0", lease_seconds=30)
    assert first is not None
    result = Attempt(station, first, AheadAsks(next_job)).run()
    assert result.outcome.state == "done" and result.next_claim is not None
    assert result.next_claim.id == job_id(2) and result.ahead[0].posted
    assert (result.ahead[0].claim.id, result.ahead[0].error) == (job_id(2), None)
    assert [(i, o.server_free) for i, o in asked] == [(job_id(1), True)]  # the hand-off, once
    assert fake.stats()["prompts"][job_id(2)]["posted"] == 1  # posted before job 1's done was recorded

    # The next attempt starts from the value: it follows the posted prompt and does not post it again.
    second = Attempt(station, result.next_claim, taken=result.ahead).run()
    assert (second.outcome.state, second.next_claim, second.ahead) == ("done", None, ())
    assert fake.stats()["prompts"][job_id(2)]["posted"] == 1
    assert queue.reads.get(job_id(3)).state == "queued"  # no next_job: nothing claimed
    station.close()
    queue.close()


@pytest.mark.timeout(60)
def test_a_posted_prompt_of_another_job_is_ignored(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path)
    queue = submit(config, [trivial_job(1), trivial_job(2)])
    station = Station(AttemptSettings.from_config(config_of(config), "cpu0", fake.url, {}), queue,
                      ResultStore(tmp_path / "store", 1 << 30))
    first = queue.leases.claim("runner-a", "cpu0", lease_seconds=30)
    assert first is not None
    result = Attempt(station, first, AheadAsks(lambda claim, o: ClaimArgs("runner-a", "cpu0", 30, None, 0))).run()
    assert result.next_claim is not None and result.ahead[0].posted
    other = dataclasses.replace(result.ahead[0], claim=result.ahead[0].claim._replace(id=job_id(9)))
    assert Attempt(station, result.next_claim, taken=(other,)).taken is None
    station.close()
    queue.close()


@pytest.mark.timeout(60)
def test_a_stuck_prompt_whose_restart_outlasts_the_alarm_slack_ends_stuck_not_timed_out(
        tmp_path: Path, fake: FakeComfy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner sees the timeout at a checkpoint, its prompt ignores /interrupt, and the server's restart
    takes longer than the alarm's slack: the alarm must not fall once that is over, or the job would be
    interrupted again (on the new, empty server) and end as a plain timeout, its real reason lost."""
    config = write_config(tmp_path, timeout_seconds=0.5, leave_queue_seconds=0.3, attempts=3)
    queue = submit(config, [trivial_job(1)])
    fake.script_by_id({job_id(1): ["hostile:run:ignore-interrupt"]})
    reported: list[float] = []

    def report(prompt_id: str) -> None:
        fake.restart()  # what the supervisor does; the prompt dies with the old server
        reported.append(time.monotonic())

    # The restart is seen as done only after the alarm's due time (the timeout plus ALARM_SLACK_SECONDS).
    channel = StuckChannel(restarts=True, report=report,
                           pending=lambda: time.monotonic() < reported[0] + ALARM_SLACK_SECONDS + 0.2)
    settings = AttemptSettings.from_config(config_of(config), "cpu0", fake.url, {})
    station = Station(settings, queue, ResultStore(tmp_path / "store", 1 << 30), stuck=channel)
    real_decide = attempt_module.decide

    def slow_decide(*args: Any) -> Any:
        time.sleep(0.05)  # the outcome takes a moment: long enough for a re-armed alarm to fall
        return real_decide(*args)

    monkeypatch.setattr(attempt_module, "decide", slow_decide)
    claim = queue.leases.claim("runner-a", "cpu0", lease_seconds=30)
    assert claim is not None
    result = Attempt(station, claim).run()
    assert (result.outcome.state, result.outcome.kind) == ("retry", "stuck"), result.outcome
    assert "the server was restarted" in (result.outcome.reason or "")
    assert len(reported) == 1, "reported once: the prompt was not interrupted a second time"
    station.close()
    queue.close()
