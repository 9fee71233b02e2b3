"""The fault table, each row its own test, at small counts (the full counts: bench/chaos.py).

Every row runs a real ``comfysup run`` on ``cpu:2`` with fake_comfy servers (B1 and K4 run ``comfysup
submit``), injects its fault, drains, and hands everything to the checker: the assertion is the
checker's verdict, with its counts and the seed in the message (replay with ``CHAOS_SEED=<seed>``).
Each also asserts that its fault really landed (kills mid-prompt, kills before the done record, …), so
a row cannot pass by missing its target.

K1, K2 and K3 give about 40 % of their jobs an input image (LoadImage → ImageInvert → SaveImage), and the
checker holds each of their outputs to its input, pixel for pixel.

U1 sends outputs to a real S3 server that is stopped and started again while jobs upload (the uploader killed
in each outage); U2 keeps it down
through the whole run while runners are killed (the uploads wait in the outbox).

P1 and P2 cut the power: the queue and the store on tests/lazyfs.py, which forgets what was not fsynced
(skipped, saying why, where FUSE is missing); P1 with a bucket is marked ``chaos``.

Rows marked ``chaos`` (Z2, D2) take longer and are deselected by default; run them with ``-m chaos``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from broker_support import connection_kept
from lazyfs import fuse_missing

from chaos import power_rows, s3_rows, scenarios
from chaos.checker import Report

if TYPE_CHECKING:
    from rabbitmq_node import OwnBroker
    from s3_support import SeaweedS3


@pytest.fixture
def on_comfyui_038(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's fakes answer as ComfyUI 0.38. Runner kills and transient failures meet 0.38 here, server kills
    and stuck prompts meet 0.3.64 (the suite's default): each row once, not once per version, which cost the
    fast subset a minute (the runner's own tests still run against both; FAKE_COMFY_VERSION turns a run)."""
    monkeypatch.setenv("FAKE_COMFY_VERSION", "0.38")


def verdict(report: Report) -> None:
    print(report.explain())
    print(report.figures)
    assert report.ok, report.explain()


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("on_comfyui_038")  # the suite's default is 0.3.64: each version meets every kind of row
def test_k1_runners_killed_at_random_moments(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.k1_runner_kills(tmp_path, chaos_seed, jobs=40, kills=8, aimed=4)
    verdict(report)
    assert report.figures["kills"] == 8 and report.figures["kills_holding_a_job"] >= 1
    assert report.figures["kills_after_post"] == 4
    assert report.states["done"] == report.jobs and report.re_executions.total() == 0
    assert report.figures["outputs_checked_against_inputs"] >= 1


@pytest.mark.timeout(120)
def test_k2_the_supervisor_killed_and_started_again(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.k2_supervisor_kills(tmp_path, chaos_seed, kills=3)
    verdict(report)
    assert report.figures["strays"] == 0 and report.states["done"] == report.jobs
    assert report.figures["outputs_checked_against_inputs"] >= 1


@pytest.mark.timeout(120)
def test_k3_servers_killed_mid_prompt(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.k3_server_kills(tmp_path, chaos_seed, jobs=40, kills=6, file_kills=4)
    verdict(report)  # no execution after a completed one: a run whose files landed is adopted
    assert report.figures["kills"] == 6 and not report.figures["failed_slots"]
    assert report.re_executions["server_kill mid-prompt"] >= 1, "no kill landed mid-prompt"
    assert report.figures["kills_after_a_file"] == 4
    assert report.figures["adopted_from_files"] >= 1, "no kill landed between a file and its history"
    assert report.states["done"] == report.jobs
    assert report.figures["outputs_checked_against_inputs"] >= 1


@pytest.mark.timeout(120)
def test_k4_submit_killed_mid_file(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.k4_submit_kills(tmp_path, chaos_seed, kills=6)
    verdict(report)
    assert report.figures["kills"] + report.figures["finished_before_the_kill"] == 6
    assert report.figures["kills"] >= 1


@pytest.mark.timeout(120)
def test_k5_runner_killed_between_success_and_the_done_record(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.k5_kill_after_success(tmp_path, chaos_seed, jobs=20, kills=6)
    verdict(report)
    landed = report.figures["kills_before_the_done_record"]
    assert landed >= 1, "no kill landed between the success and the done record"
    assert report.figures["adopted"] >= landed and report.executions == report.jobs  # each job once


@pytest.mark.timeout(120)
def test_z1_runner_stopped_past_its_lease(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.z1_stopped_runners(tmp_path, chaos_seed, jobs=20, stops=4)
    verdict(report)
    assert report.figures["stops"] == 4 and report.figures["killed_by_supervisor"] == 4


@pytest.mark.chaos
@pytest.mark.timeout(180)
def test_z2_database_locked_past_the_lease(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.z2_lock_past_the_lease(tmp_path, chaos_seed, jobs=30, locks=2)
    verdict(report)
    assert report.figures["attempts_stopped"] >= 1


@pytest.mark.timeout(120)
def test_d1_database_locked_for_short_moments(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.d1_short_locks(tmp_path, chaos_seed, jobs=20, locks=6)
    verdict(report)


@pytest.mark.chaos
@pytest.mark.timeout(300)
def test_d2_a_long_reader_and_the_wal(tmp_path: Path, chaos_seed: int) -> None:
    verdict(scenarios.d2_long_reader(tmp_path, chaos_seed, jobs=600))


@pytest.mark.timeout(120)
def test_f1_the_result_store_s_disk_full(tmp_path: Path, chaos_seed: int) -> None:
    try:
        report = scenarios.f1_disk_full(tmp_path, chaos_seed, jobs=20)
    except scenarios.CannotMount as exc:
        pytest.skip(str(exc))
    verdict(report)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("on_comfyui_038")  # the suite's default is 0.3.64: each version meets every kind of row
def test_t1_thirty_percent_of_prompts_fail_transiently(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.t1_transient_failures(tmp_path, chaos_seed, jobs=40)
    verdict(report)
    assert report.figures["first_posts_faulty"] >= 1


@pytest.mark.timeout(120)
def test_o1_oom_storms_end_every_job_once(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.o1_oom_storms(tmp_path, chaos_seed, jobs=12)
    verdict(report)
    assert report.figures["ooms"] >= 1


@pytest.mark.timeout(120)
def test_s1_hostile_output_names(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.s1_hostile_names(tmp_path, chaos_seed, jobs=10)
    verdict(report)
    assert report.figures["hostile"] >= 1


@pytest.mark.timeout(120)
def test_h1_a_hostile_server_never_takes_a_gpu_out_of_service(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.h1_hostile_server(tmp_path, chaos_seed, jobs=30)
    verdict(report)
    assert report.figures["hostile_jobs"] >= 5 and report.figures["mutations"] >= 5
    assert report.states["done"] + report.states.get("dead", 0) == report.jobs


@pytest.mark.timeout(120)
def test_s2_only_loopback_sockets(tmp_path: Path, chaos_seed: int) -> None:
    verdict(scenarios.s2_listening_sockets(tmp_path, chaos_seed, jobs=8))


@pytest.mark.timeout(120)
def test_s3_a_canary_secret_appears_nowhere(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.s3_canary_secret(tmp_path, chaos_seed, jobs=16)
    verdict(report)
    assert report.figures["dead"] >= 1 and report.figures["outputs_searched"] >= 10


@pytest.mark.timeout(120)
def test_b1_fuzzed_jobs_files(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.b1_fuzzed_lines(tmp_path, chaos_seed, examples=120)
    verdict(report)
    assert report.figures["accepted"] >= 1 and report.figures["rejected"] >= 1


@pytest.mark.timeout(120)
def test_h2_prompts_stuck_after_interrupt_restart_their_server(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.h2_stuck_prompts(tmp_path, chaos_seed, jobs=16, stuck=4)
    verdict(report)
    assert report.figures["stuck_restarts"] == report.figures["stuck_prompts"] >= 4
    assert report.figures["server_restarts"] == report.figures["stuck_restarts"]
    assert not report.figures["failed_slots"]
    assert report.re_executions["stuck (server restarted)"] >= 1


@pytest.mark.timeout(120)
def test_r1_consumer_killed_between_commit_and_ack(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.r1_consumer_killed_before_ack(tmp_path, chaos_seed, jobs=24, prefetch=2, rate=0.7)
    verdict(report)  # every published job done exactly once, every end announced, none lost
    # 0.7 of 24 messages expected, at least 10 asked: a row killed far less often tests nothing
    assert report.figures["consumer_kills"] >= 10, "fewer than ten kills between commit and ack"
    assert report.states["done"] == report.jobs == 24


@pytest.mark.timeout(120)
def test_r2_broker_restarted_mid_stream(tmp_path: Path, chaos_seed: int, own_broker: OwnBroker) -> None:
    """Restarts a private node (tests/rabbitmq_node.py), never the machine's broker."""
    with connection_kept():  # the machine's broker: a connection to it survives the row
        report = scenarios.r2_broker_restarted(tmp_path, chaos_seed, jobs=80, restarts=2, node=own_broker)
    verdict(report)
    assert report.faults["broker_stop"] == 2 and report.figures["consumer_reconnections"] >= 2
    assert report.states["done"] == report.jobs == 80


@pytest.mark.timeout(120)
def test_r3_all_connections_closed_by_the_broker(tmp_path: Path, chaos_seed: int, own_broker: OwnBroker) -> None:
    """Closes the connections of a private node (the one R2 restarted), never the machine's broker's."""
    with connection_kept():
        report = scenarios.r3_connections_closed(tmp_path, chaos_seed, jobs=80, closes=4, node=own_broker)
    verdict(report)
    assert report.faults["broker_closed_connections"] == 4 and report.figures["consumer_reconnections"] >= 4
    assert report.states["done"] == report.jobs == 80


@pytest.mark.timeout(150)
def test_a1_api_submits_while_the_api_runners_and_servers_are_killed(tmp_path: Path, chaos_seed: int) -> None:
    report = scenarios.a1_api_kills(tmp_path, chaos_seed, api_kills=4, runner_kills=3, server_kills=3)
    verdict(report)  # every accepted job done once; a retry after a dropped connection made no second job
    assert report.faults["api_kill"] == 4 and report.faults["runner_kill"] == 3 and report.faults["server_kill"] == 3
    assert report.figures["drops_after_commit"] >= 1 and report.figures["client_drops"] >= 1, report.figures
    assert report.figures["reused_after_commit_drop"] == report.figures["drops_after_commit"], report.figures
    assert report.figures["kills_mid_request"] == 2 and report.figures["cut_before_answer"] >= 1, report.figures
    assert report.states["done"] == report.jobs == report.figures["jobs_accepted"]


@pytest.mark.timeout(150)
def test_u1_the_bucket_stopped_and_started_again_while_jobs_upload(tmp_path: Path, chaos_seed: int,
                                                                    s3_server: SeaweedS3) -> None:
    report = s3_rows.u1_bucket_stopped(tmp_path, chaos_seed, s3_server, jobs=12, outages=2)
    verdict(report)  # every done job's objects read back from the bucket and hashed
    assert report.states["done"] == report.jobs and report.re_executions.total() == 0
    assert report.figures["objects_checked"] >= report.jobs
    assert report.figures["uploader_kills_during_outages"] == 2


@pytest.mark.timeout(120)
def test_u2_the_bucket_down_through_the_run_while_runners_are_killed(tmp_path: Path, chaos_seed: int,
                                                                       s3_server: SeaweedS3) -> None:
    report = s3_rows.u2_bucket_down_for_minutes(tmp_path, chaos_seed, s3_server, jobs=16, down_seconds=5.0,
                                                kills=2)
    verdict(report)  # every done job's objects read back from the bucket and hashed
    assert report.states["done"] == report.jobs and report.states["dead"] == 0
    assert report.figures["objects_checked"] >= report.jobs
    assert report.figures["runner_kills_during_outage"] == 2 and report.figures["storing_peak"] >= 1

@pytest.fixture
def fuse() -> None:
    """Rows P1 and P2 mount a lazy filesystem (tests/lazyfs.py): skipped, saying why, where FUSE is missing."""
    why = fuse_missing()
    if why:
        pytest.skip(f"no lazy filesystem for the power cuts: {why}")


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("fuse")
def test_p1_power_cut_while_jobs_are_submitted_run_and_stored(tmp_path: Path, chaos_seed: int) -> None:
    report = power_rows.p1_power_cuts(tmp_path, chaos_seed, cuts=2, jobs_per_cut=6)
    verdict(report)  # every acknowledged job done, its files whole with their hashes, the queue intact
    assert report.faults["power_cut"] == 2 and report.figures["cuts_during"].get("running", 0) >= 1
    assert not report.figures["cuts_during"].get("missed"), report.figures
    assert report.states["done"] == report.jobs


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("fuse")
def test_p2_power_cut_during_submits_of_large_files(tmp_path: Path, chaos_seed: int) -> None:
    report = power_rows.p2_power_cuts_in_submits(tmp_path, chaos_seed, cuts=3, inputs=2, input_kib=512, lines=100)
    verdict(report)  # every acknowledged submit whole in the queue, a cut one whole or absent, inputs intact
    assert report.faults["power_cut"] == 3 and report.figures["inputs_checked"] >= 2


@pytest.mark.chaos
@pytest.mark.timeout(180)
@pytest.mark.usefixtures("fuse")
def test_p1_power_cut_with_outputs_in_a_bucket(tmp_path: Path, chaos_seed: int, s3_server: SeaweedS3) -> None:
    report = power_rows.p1_power_cuts(tmp_path, chaos_seed, cuts=3, jobs_per_cut=6, bucket=s3_server)
    verdict(report)  # every done job's objects read back from the bucket and hashed
    assert report.faults["power_cut"] == 3 and report.states["done"] == report.jobs
    assert report.figures["objects_checked"] >= report.jobs
