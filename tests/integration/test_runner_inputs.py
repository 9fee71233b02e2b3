"""In the runner: a job's input files uploaded to its server before the POST, under a name derived
from their hash, once per server; LoadImage → ImageInvert → SaveImage through comfysup with every output pixel
checked against its input; an upload's failure classified and retried; a launched server's copy bounded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from comfysup import assets
from comfysup.comfy import ComfyClient, ServerUnavailable
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from fake_comfy.uploads import decode_png
from tests.input_images import INVERT, expected_inverse, random_png
from tests.runner_helpers import config_of, job_id, submit, write_config


def invert_jobs(tmp: Path, files: list[str], first: int = 1) -> list[dict[str, Any]]:
    (tmp / "invert.json").write_text(json.dumps(INVERT))
    return [{"id": job_id(n), "workflow": "invert.json",
             "set": {"1.image": {"file": name}, "3.filename_prefix": f"inv{n}"}}
            for n, name in enumerate(files, start=first)]


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    server = FakeComfy(base_directory=tmp_path / "fake", node_ms=1)
    server.start()
    yield server
    server.stop()


@pytest.mark.timeout(60)
def test_every_output_pixel_is_the_inverse_of_its_input(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path)
    names = []
    for n in range(3):
        (tmp_path / f"in{n}.png").write_bytes(random_png(n))
        names.append(f"in{n}.png")
    queue = submit(config, invert_jobs(tmp_path, names))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    for n, name in enumerate(names, start=1):
        job = queue.reads.get(job_id(n))
        assert job.state == "done", job.reason
        (out,) = job.outputs
        _w, _h, _c, inverted = decode_png(Path(out.path).read_bytes())
        _w, _h, _c, original = decode_png((tmp_path / name).read_bytes())
        assert list(inverted) == [expected_inverse(v) for v in original]
    uploaded = sorted(p.name for p in (Path(fake.input_directory) / "comfysup").iterdir())
    assert uploaded == sorted(assets.upload_name(assets.hash_bytes((tmp_path / n).read_bytes()), n) for n in names)


@pytest.mark.timeout(60)
def test_an_input_many_jobs_share_is_uploaded_once_per_server(tmp_path: Path, fake: FakeComfy,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = ComfyClient.upload_image
    monkeypatch.setattr(ComfyClient, "upload_image", lambda self, name, data, sub: calls.append(name) or
                        original(self, name, data, sub))
    config = write_config(tmp_path)
    (tmp_path / "cat.png").write_bytes(random_png(7))
    queue = submit(config, invert_jobs(tmp_path, ["cat.png"] * 8))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 8
    assert len(calls) == 1
    assert queue.assets.asset_totals() == {"assets": 1, "bytes": (tmp_path / "cat.png").stat().st_size, "uploads": 1}
    # A second runner of the same server (a restart) trusts what the queue recorded: still one upload.
    submit(config, invert_jobs(tmp_path, ["cat.png"] * 2, first=20))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert len(calls) == 1


@pytest.mark.timeout(60)
def test_an_upload_the_server_lost_is_uploaded_again_on_the_retry(tmp_path: Path, fake: FakeComfy) -> None:
    """A server comfysup did not launch, its input folder wiped (a new container, a clean-up): the queue's
    record of the upload is stale, ComfyUI refuses the prompt with 400 ``Invalid image file: comfysup/<hash>``;
    that is transient, the record is forgotten and the retry uploads the file again."""
    config = write_config(tmp_path)
    (tmp_path / "cat.png").write_bytes(random_png(11))
    queue = submit(config, invert_jobs(tmp_path, ["cat.png"]))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    assert queue.reads.get(job_id(1)).state == "done"
    for path in (Path(fake.input_directory) / "comfysup").iterdir():
        path.unlink()
    submit(config, invert_jobs(tmp_path, ["cat.png"], first=2))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    job = queue.reads.get(job_id(2))
    assert job.state == "done", job.reason
    assert job.attempt == 2 and "Invalid image file: comfysup/" in (job.attempts[0].reason or "")
    assert len(list((Path(fake.input_directory) / "comfysup").iterdir())) == 1  # uploaded again
    (out,) = job.outputs
    _w, _h, _c, inverted = decode_png(Path(out.path).read_bytes())
    _w, _h, _c, original = decode_png((tmp_path / "cat.png").read_bytes())
    assert list(inverted) == [expected_inverse(v) for v in original]


@pytest.mark.timeout(60)
def test_a_failed_upload_is_a_transient_failure_of_the_attempt(tmp_path: Path, fake: FakeComfy,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    original, failures = ComfyClient.upload_image, [1]

    def flaky(self: ComfyClient, name: str, data: bytes, sub: str) -> Any:
        if failures:
            failures.pop()
            raise ServerUnavailable("POST /upload/image 503, busy", "upload")
        return original(self, name, data, sub)

    monkeypatch.setattr(ComfyClient, "upload_image", flaky)
    config = write_config(tmp_path)
    (tmp_path / "cat.png").write_bytes(random_png(3))
    queue = submit(config, invert_jobs(tmp_path, ["cat.png"]))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    job = queue.reads.get(job_id(1))
    assert job.state == "done" and job.attempt == 2 and "upload" in (job.attempts[0].reason or "")
    prompts = fake.stats()["prompts"]
    assert [p["executed"] for p in prompts.values()] == [1]  # nothing was posted by the failed attempt


@pytest.mark.timeout(60)
def test_a_launched_servers_copy_stays_under_server_cache_mb(tmp_path: Path, fake: FakeComfy) -> None:
    config = write_config(tmp_path)
    doc = config_of(config)
    text = config.read_text() + tomli_w.dumps({"assets": {"server_cache_mb": 1}})
    config.write_text(text)
    names = []
    for n in range(4):
        (tmp_path / f"big{n}.png").write_bytes(random_png(n, pad=400_000))
        names.append(f"big{n}.png")
    queue = submit(config, invert_jobs(tmp_path, names))
    output_dir = Path(fake.output_directory)
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True, output_dirs={"cpu0": output_dir})).run()
    assert doc.assets.server_cache_mb == 2048 and config_of(config).assets.server_cache_mb == 1
    assert [j.state for j in queue.reads.iter_jobs()] == ["done"] * 4
    left = list((Path(fake.input_directory) / "comfysup").iterdir())
    assert sum(p.stat().st_size for p in left) <= 2**20
    last = assets.upload_name(assets.hash_bytes((tmp_path / names[-1]).read_bytes()), names[-1])
    assert last in {p.name for p in left}


@pytest.mark.timeout(60)
def test_show_results_webhooks_page_status_and_metrics_list_inputs(tmp_path: Path, fake: FakeComfy) -> None:
    from comfysup.commands import results, show, status
    from comfysup.observability import web, webhooks
    from comfysup.observability.views import overview

    config = write_config(tmp_path)
    (tmp_path / "cat.png").write_bytes(random_png(11))
    digest = assets.hash_bytes((tmp_path / "cat.png").read_bytes())
    queue = submit(config, invert_jobs(tmp_path, ["cat.png"]))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    job = queue.reads.get(job_id(1))
    text = show.render(job, with_workflow=False)
    assert f"input      1.image  cat.png  {digest}" in text
    assert show.as_dict(job, False)["inputs"] == [{"input": "1.image", "name": "cat.png", "hash": digest,
                                                   "size": (tmp_path / "cat.png").stat().st_size}]
    assert results.cell(job.params["1.image"]) == f"cat.png {digest}"
    assert webhooks.record_body(job)["inputs"][0]["hash"] == digest
    page = web.render_page(overview(queue, None, done=5), 5.0)
    assert digest[:19] in page
    totals = queue.assets.asset_totals()
    assert status.render_inputs(totals) == (f"inputs: 1 file(s) stored, {totals['bytes']:,} bytes, 1 upload(s) to "
                                            "servers")
    from comfysup.observability.metrics import Metrics

    exposition = Metrics(queue, lambda: None).exposition().decode()
    assert "comfysup_input_files 1.0" in exposition
    assert f"comfysup_input_bytes {float(totals['bytes'])}" in exposition
    assert "comfysup_input_uploads_total 1.0" in exposition


@pytest.mark.timeout(60)
def test_a_stored_input_changed_on_disk_is_never_sent_under_its_old_hash(tmp_path: Path, fake: FakeComfy) -> None:
    """The asset store's copy is hashed again before the upload; bytes changed on disk since the submit
    (same size: a check of the size alone would pass them) end the job with the reason, and nothing is sent."""
    config = write_config(tmp_path)
    (tmp_path / "in.png").write_bytes(random_png(7))
    queue = submit(config, invert_jobs(tmp_path, ["in.png"]))
    digest = assets.hash_bytes((tmp_path / "in.png").read_bytes())
    stored = next(p for p in tmp_path.rglob(digest.removeprefix("blake3:")) if p.is_file())
    stored.write_bytes(random_png(8)[: stored.stat().st_size].ljust(stored.stat().st_size, b"\0"))
    Runner(config_of(config), "cpu0", fake.url, RunnerOptions(until_empty=True)).run()
    job = queue.reads.get(job_id(1))
    assert job.state == "dead" and "no longer matches its hash" in (job.reason or ""), job.reason
    folder = Path(fake.input_directory) / "comfysup"
    assert not folder.exists() or list(folder.iterdir()) == []
