"""`comfysup results --csv` says where each file is (host:path): with several machines, store.dir may be
each one's own disk, so a path alone does not find a file."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from pg_support import pg_url  # noqa: F401  (a fixture)
from queue_contract import T0, make_job

from comfysup import records
from comfysup.cli import main as cli
from comfysup.config import load_config
from comfysup.queue import open_queue
from comfysup.queue.base import Output


@pytest.fixture(params=["sqlite", "postgres"])
def config_path(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    path = tmp_path / "config.toml"
    if request.param == "sqlite":
        path.write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    else:
        path.write_text(f'[queue]\nurl = "{request.getfixturevalue("pg_url")}"\n')
    return path


def test_results_csv_names_the_machine_and_each_file_as_host_path(config_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    queue = open_queue(load_config(str(config_path), env={}))
    queue.intake.submit([make_job(1), records.replace(make_job(2), tenant="studio")], now=T0)
    claim = queue.leases.claim("machine-b/4242/gpu1/abcd", "gpu1", 30, now=T0)
    assert claim is not None
    files = [Output("out/a.png", 3, "aa" * 32, f"/srv/results/{claim.id}/out/a.png"),
             Output("b.png", 4, "bb" * 32, f"/srv/results/{claim.id}/b.png")]
    queue.leases.complete(claim, files, now=T0 + 2)
    queue.close()
    assert cli(["results", "--csv", "--config", str(config_path)]) == 0
    rows = {r["id"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    done = rows[claim.id]
    assert done["machine"] == "machine-b"
    assert done["locations"] == (f"machine-b:/srv/results/{claim.id}/out/a.png "
                                 f"machine-b:/srv/results/{claim.id}/b.png")
    other = rows[make_job(2).id]
    assert (other["status"], other["machine"], other["locations"]) == ("queued", "", "")
    assert (done["tenant"], other["tenant"]) == ("default", "studio")
    assert cli(["results", "--config", str(config_path)]) == 0
    table = capsys.readouterr().out
    assert "machine" in table.splitlines()[0] and "machine-b" in table
