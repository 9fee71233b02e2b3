"""On PostgreSQL: input files submitted on machine A (bytes in the database, chunked) run on machine
B's server, which shares nothing with A but the database; every output checked against its input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)

from comfysup.jobs import JobsFile
from comfysup.queue.base import HOSTNAME_VARIABLE
from comfysup.queue.postgres import PostgresQueue
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy import FakeComfy
from fake_comfy.uploads import decode_png
from tests.integration.test_runner_inputs import INVERT, expected_inverse, random_png
from tests.integration.test_runner_postgres import pg_config
from tests.runner_helpers import job_id


@pytest.mark.timeout(60)
def test_files_submitted_on_machine_a_run_on_machine_b(tmp_path: Path, pg_url: str,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    originals = {}
    lines = []
    (a / "invert.json").write_text(json.dumps(INVERT))
    for n in range(1, 4):
        originals[n] = random_png(100 + n)
        (a / f"in{n}.png").write_bytes(originals[n])
        lines.append({"id": job_id(n), "workflow": "invert.json",
                      "set": {"1.image": {"file": f"in{n}.png"}, "3.filename_prefix": f"inv{n}"}})
    (a / "jobs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    monkeypatch.setenv(HOSTNAME_VARIABLE, "machine-a")
    queue_a = PostgresQueue(pg_url)
    file = JobsFile(a / "jobs.jsonl")
    assert file.validate().ok
    assert queue_a.intake.submit(file.jobs()).inserted == 3
    queue_a.close()
    shutil.rmtree(a)  # machine B cannot see A's files: only the database
    monkeypatch.setenv(HOSTNAME_VARIABLE, "machine-b")
    fake: Any = FakeComfy(base_directory=b / "fake", node_ms=1)
    with fake:
        Runner(pg_config(b, pg_url), "gpu0", fake.url, RunnerOptions(until_empty=True)).run()
    queue = PostgresQueue(pg_url)
    for n in range(1, 4):
        job = queue.reads.get(job_id(n))
        assert job.state == "done", job.reason
        assert job.machine == "machine-b"
        (out,) = job.outputs
        _w, _h, _c, inverted = decode_png(Path(out.path).read_bytes())
        _w, _h, _c, original = decode_png(originals[n])
        assert list(inverted) == [expected_inverse(v) for v in original]
    assert queue.assets.asset_totals()["uploads"] == 3
    assert len(queue.assets.server_assets("machine-b/gpu0")) == 3
    assert queue.assets.server_assets("machine-a/gpu0") == {}
    queue.close()
