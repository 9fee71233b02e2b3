"""Catch-up after a runner died between its POST and recording the prompt (found by the chaos suite).

The dead attempt left no record of the server its prompt runs on; the next attempt, on another server,
must find the prompt there and follow it, not post it again (two executions of one job at once).
"""

from __future__ import annotations

import time
import zlib
from pathlib import Path

import pytest

from comfysup.comfy import ComfyClient
from comfysup.runner import outputs
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from tests.runner_helpers import config_of, post_and_wait, submit, trivial_job, write_config

pytestmark = pytest.mark.usefixtures("comfyui_version")  # against ComfyUI 0.3.64 and 0.38 alike


@pytest.mark.timeout(60)
@pytest.mark.parametrize("recorded", [None, "b"], ids=["nothing recorded", "an older attempt's server"])
def test_a_prompt_posted_by_a_runner_that_died_before_recording_it_is_followed_on_its_server(
        tmp_path: Path, recorded: str | None) -> None:
    with FakeComfy(base_directory=tmp_path / "a", node_ms=300) as a, \
            FakeComfy(base_directory=tmp_path / "b", node_ms=5) as b:
        config = write_config(tmp_path)
        queue = submit(config, [trivial_job(1)])
        if recorded:  # an earlier attempt ran on b and was retried: last_server names b
            first = queue.leases.claim("runner-b", "b", lease_seconds=30)
            assert first is not None
            queue.leases.record_prompt(first, "b", 99)
            queue.leases.retry_later(first, time.time(), "POST /prompt 500")
        claim = queue.leases.claim("runner-a", "a", lease_seconds=30)
        assert claim is not None
        ComfyClient(a.url).post_prompt(claim.workflow, claim.id, "runner-a-socket")
        # runner-a was killed here, before record_prompt: the supervisor proves it dead and releases it.
        assert queue.leases.release_owner("runner-a", "runner process died") == [claim.id]

        Runner(config_of(config), "b", b.url, RunnerOptions(peers={"a": a.url, "b": b.url}, until_empty=True)).run()

        job = queue.reads.get(claim.id)
        assert job.state == "done" and job.attempt == (3 if recorded else 2)
        assert a.stats()["prompts"][claim.id]["executed"] == 1
        assert b.stats()["prompts"].get(claim.id, {}).get("posted", 0) == 0, "posted again on b"
        assert job.attempts[-1].server == "a"  # followed where it ran


@pytest.mark.timeout(60)
def test_an_attempt_that_never_posted_does_not_hide_a_run_on_another_machines_server(tmp_path: Path) -> None:
    """Machine A's server (managed elsewhere) still runs the job when A dies. On machine B one runner claims it
    and lets it go before posting (its server's catalogue refused it, or it was stopping); the next runner of B
    must still ask A's server, found by the URL A's attempt named, not only the newest attempt's (a peer here)."""
    with FakeComfy(base_directory=tmp_path / "a", node_ms=300) as a, \
            FakeComfy(base_directory=tmp_path / "b", node_ms=5) as b:
        config = write_config(tmp_path)
        queue = submit(config, [trivial_job(1)])
        claim = queue.leases.claim("machine-a/1/gpu0/t", "gpu0", lease_seconds=30, url=a.url)
        assert claim is not None
        number = ComfyClient(a.url).post_prompt(claim.workflow, claim.id, "machine-a-socket")
        queue.leases.record_prompt(claim, "gpu0", number, a.url)
        assert queue.leases.release_owner("machine-a/1/gpu0/t", "machine A died") == [claim.id]
        peer = "http://127.0.0.1:9"  # B's other server: refused the job and never posted it
        refused = queue.leases.claim("machine-b/2/gpu1/t", "gpu1", lease_seconds=30, url=peer)
        assert refused is not None and refused.id == claim.id
        queue.leases.release(refused, "refused by gpu1's catalogue", count_attempt=False)

        Runner(config_of(config), "gpu0", b.url, RunnerOptions(peers={"gpu1": peer}, until_empty=True)).run()

        job = queue.reads.get(claim.id)
        assert job.state == "done"
        assert a.stats()["prompts"][claim.id]["executed"] == 1
        assert b.stats()["prompts"].get(claim.id, {}).get("posted", 0) == 0, "posted again on B's server"


@pytest.mark.timeout(60)
def test_a_run_adopted_from_another_machines_server_is_read_from_that_server_not_this_ones_folder(
        tmp_path: Path) -> None:
    """Both machines call their server gpu0. Machine A's gpu0 ran the job into output/comfysup/<job>/; B's gpu0
    folder holds a file of the same name from an earlier attempt there. B's runner adopts A's run (found by the URL
    A's attempt recorded) and must take A's file, through A's /view, never the one in its own gpu0's folder."""
    import hashlib

    with FakeComfy(base_directory=tmp_path / "a", node_ms=5) as a, \
            FakeComfy(base_directory=tmp_path / "b", node_ms=5) as b:
        config = write_config(tmp_path)
        queue = submit(config, [trivial_job(1)])
        claim = _ran_on_machine_a(queue, a)
        assert queue.leases.release_owner("machine-a/1/gpu0/t", "machine A died") == [claim.id]
        (a_file,) = (Path(a.output_directory) / "comfysup" / claim.id).glob("*.png")
        stale = Path(b.output_directory) / "comfysup" / claim.id / a_file.name
        stale.parent.mkdir(parents=True)
        # A whole PNG of another run: the same name, other bytes (a text chunk more, before the image's own).
        data = a_file.read_bytes()
        extra = b"tEXt" + b"stale\x00B"
        chunk = len(extra[4:]).to_bytes(4, "big") + extra + zlib.crc32(extra).to_bytes(4, "big")
        stale.write_bytes(data[:33] + chunk + data[33:])
        assert stale.read_bytes() != a_file.read_bytes()

        Runner(config_of(config), "gpu0", b.url,
               RunnerOptions(until_empty=True, output_dirs={"gpu0": Path(b.output_directory)})).run()

        job = queue.reads.get(claim.id)
        assert job.state == "done", job.reason
        (out,) = job.outputs
        assert out.sha256 == hashlib.sha256(a_file.read_bytes()).hexdigest(), "stored B's stale file, not A's run"
        assert [v["filename"] for v in a.stats()["views"]] == [a_file.name]
        assert b.stats()["prompts"].get(claim.id, {}).get("posted", 0) == 0


@pytest.mark.timeout(60)
def test_another_machines_same_named_server_down_does_not_stand_for_this_ones_folder(tmp_path: Path) -> None:
    """Machine A's gpu0 ran the job and is down now; B's own gpu0 answers and holds neither the prompt nor its
    history, and B's gpu0 folder holds a whole run of the job (an earlier attempt there). That folder is adopted as
    B's own server's (by design), read as B's: A's server, down under the same name, is not this machine's and its
    client must not stand for that folder (the read then had no folder at all and the runner crashed)."""
    import hashlib

    a = FakeComfy(base_directory=tmp_path / "a", node_ms=5)
    a.start()
    with FakeComfy(base_directory=tmp_path / "b", node_ms=5) as b:
        config = write_config(tmp_path, http_timeout_seconds=1.0)
        queue = submit(config, [trivial_job(1)])
        claim = _ran_on_machine_a(queue, a)
        (a_file,) = (Path(a.output_directory) / "comfysup" / claim.id).glob("*.png")
        mine = Path(b.output_directory) / "comfysup" / claim.id / a_file.name
        mine.parent.mkdir(parents=True)
        mine.write_bytes(a_file.read_bytes())
        digest = hashlib.sha256(mine.read_bytes()).hexdigest()
        a.stop()  # machine A and its server are gone
        assert queue.leases.release_owner("machine-a/1/gpu0/t", "machine A died") == [claim.id]

        Runner(config_of(config), "gpu0", b.url,
               RunnerOptions(until_empty=True, output_dirs={"gpu0": Path(b.output_directory)})).run()

        job = queue.reads.get(claim.id)
        assert job.state == "done", job.reason
        (out,) = job.outputs
        assert out.sha256 == digest and "adopted" in [p for p, _ in job.attempts[-1].trace["phases"]]
        assert b.stats()["prompts"].get(claim.id, {}).get("posted", 0) == 0
        assert not mine.parent.exists()  # B's own folder, emptied once the job was done


def _ran_on_machine_a(queue, a: FakeComfy):
    """Machine A's runner (its gpu0 at ``a``) claimed the job, ran it into its own folder of A's output folder
    (as for a server that machine launched) and recorded the prompt there; then machine A died."""
    claim = queue.leases.claim("machine-a/1/gpu0/t", "gpu0", lease_seconds=30, url=a.url)
    assert claim is not None
    number = post_and_wait(a.url, outputs.plan(claim.workflow, claim.id).workflow, claim.id, "machine-a-socket")
    queue.leases.record_prompt(claim, "gpu0", number, a.url)
    return claim
