"""The node catalogue: two fake servers whose catalogues differ. A job only one can run goes only
there (the other's runner never posts it, nor counts an attempt of it); a job neither can run is refused at
submit; with no catalogue yet, submit warns once and accepts the jobs."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from cli_support import cli, write_config
from runner_helpers import TRIVIAL, config_of, job_id, jobs_file, trivial_job
from runner_helpers import write_config as runner_config

from comfysup.jobs import JobsFile
from comfysup.jobs.catalogue import Catalogue
from comfysup.queue.sqlite import SQLiteQueue
from comfysup.runner.loop import Runner
from comfysup.runner.options import RunnerOptions
from fake_comfy.inprocess import FakeComfy

BLURLESS = {**TRIVIAL, "2": {"class_type": "ImageBlur", "inputs": {"image": ["1", 0], "blur_radius": 1,
                                                                    "sigma": 1.0}}}


def _submit(queue: SQLiteQueue, path: Path) -> JobsFile:
    cats = [Catalogue(r.id, r.info, tuple(r.servers)) for r in queue.fleet.catalogues()]
    jobs = JobsFile(path, catalogues=cats)
    checked = jobs.validate()
    assert checked.ok, checked.problems
    queue.intake.submit(jobs.jobs())
    return jobs


def _drain(*runners: Runner) -> None:
    threads = [threading.Thread(target=r.run) for r in runners]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)


def test_a_job_only_one_server_can_run_goes_only_there(tmp_path: Path) -> None:
    config = runner_config(tmp_path)
    queue = SQLiteQueue(tmp_path / "queue.db")
    with FakeComfy(base_directory=tmp_path / "a") as a, \
            FakeComfy(base_directory=tmp_path / "b", without_nodes=["ImageBlur"]) as b:
        for name, fake in (("a", a), ("b", b)):  # each runner records its catalogue when it starts
            Runner(config_of(config), name, fake.url, RunnerOptions(until_empty=True)).run()
        assert len(queue.fleet.catalogues()) == 2
        jobs = [trivial_job(1), {**trivial_job(2), "workflow": BLURLESS}, trivial_job(3), trivial_job(4)]
        _submit(queue, jobs_file(tmp_path, jobs))
        assert [len(j.refused) for j in JobsFile(jobs_file(tmp_path, jobs),
                                                  catalogues=_cats(queue)).jobs()] == [0, 1, 0, 0]
        _drain(Runner(config_of(config), "a", a.url, RunnerOptions(until_empty=True)),
               Runner(config_of(config), "b", b.url, RunnerOptions(until_empty=True)))
        blurred = queue.reads.get(job_id(2))
        assert blurred.state == "done"
        assert [(t.server, t.outcome) for t in blurred.attempts] == [("a", "done")]
        assert job_id(2) not in b.stats()["prompts"]
        assert all(queue.reads.get(job_id(n)).state == "done" for n in (1, 3, 4))


def _cats(queue: SQLiteQueue) -> list[Catalogue]:
    return [Catalogue(r.id, r.info, tuple(r.servers)) for r in queue.fleet.catalogues()]


def test_a_job_submitted_before_a_catalogue_is_refused_by_the_runner_that_meets_it(tmp_path: Path) -> None:
    """Submitted before the servers recorded their catalogues: b's runner meets each job first. With only b
    known, the job no server can run is dead-lettered at once; once a is known, b leaves the next one without
    counting an attempt, and a runs it."""
    config = runner_config(tmp_path)
    queue = SQLiteQueue(tmp_path / "queue.db")
    _submit(queue, jobs_file(tmp_path, [{**trivial_job(1), "workflow": BLURLESS},
                                        {**trivial_job(2), "workflow": BLURLESS}]))
    with FakeComfy(base_directory=tmp_path / "a") as a, \
            FakeComfy(base_directory=tmp_path / "b", without_nodes=["ImageBlur"]) as b:
        runner_b = Runner(config_of(config), "b", b.url)
        runner_b.catalogue.refresh()
        claim = queue.leases.claim("test", "b", 10, catalogue=runner_b.catalogue.id)
        assert claim is not None and claim.id == job_id(1)
        assert runner_b.run_one(claim) == ()  # nothing taken ahead
        dead = queue.reads.get(job_id(1))
        assert dead.state == "dead"
        assert dead.reason == "no server can run it: node 2 (ImageBlur): class 'ImageBlur' is not installed"

        Runner(config_of(config), "a", a.url).catalogue.refresh()
        claim = queue.leases.claim("test", "b", 10, catalogue=runner_b.catalogue.id)
        assert claim is not None and claim.id == job_id(2)
        assert runner_b.run_one(claim) == ()  # nothing taken ahead
        job = queue.reads.get(job_id(2))
        assert (job.state, job.attempt) == ("queued", 0)
        assert [(t.server, t.outcome) for t in job.attempts] == [("b", "released_uncounted")]
        assert queue.leases.claim("test", "b", 10, catalogue=runner_b.catalogue.id) is None
        Runner(config_of(config), "a", a.url, RunnerOptions(until_empty=True)).run()
        job = queue.reads.get(job_id(2))
        assert job.state == "done" and job.attempt == 1
        assert not set(b.stats()["prompts"]) & {job_id(1), job_id(2)}


def _object_info(url: str) -> dict[str, Any]:
    import requests

    return requests.get(f"{url}/object_info", timeout=5).json()


def test_a_job_no_server_can_run_is_refused_at_submit(tmp_path: Path, capsys: Any) -> None:
    conf = write_config(tmp_path)
    queue = SQLiteQueue(tmp_path / "var" / "queue.db")
    info = _object_info_of_fake(tmp_path)
    queue.fleet.record_catalogue("gpu0", "host", info)
    queue.close()
    lines = [{"id": job_id(1), "workflow": {**TRIVIAL, "2": {"class_type": "Foo", "inputs": {"image": ["1", 0]}}}},
             {"id": job_id(2), "workflow": TRIVIAL, "set": {"1.width": 0}}]
    path = jobs_file(tmp_path, lines)
    code, _out, err = cli(capsys, "submit", "--config", str(conf), str(path))
    assert code == 2
    assert f"{path}:1: node 2: class 'Foo' is on no server (its custom node is not installed on any)" in err
    assert f"{path}:2: node 1 (EmptyImage): width 0 is below its minimum" in err
    assert "warning: no server" not in err


def _object_info_of_fake(tmp_path: Path) -> dict[str, Any]:
    with FakeComfy(base_directory=tmp_path / "fake") as fake:
        return _object_info(fake.url)


def test_no_catalogue_yet_warns_once_and_accepts(tmp_path: Path, capsys: Any) -> None:
    conf = write_config(tmp_path)
    path = jobs_file(tmp_path, [{"id": job_id(n), "workflow": TRIVIAL, "set": {"1.width": 0}} for n in range(3)])
    code, out, err = cli(capsys, "submit", "--config", str(conf), str(path))
    assert code == 0, err
    assert err.count("warning: no server has recorded its node catalogue") == 1
    assert "submitted 3 job(s)" in out
    assert json.loads(path.read_text().splitlines()[0])["id"] == job_id(0)


def test_fake_comfy_serves_the_catalogue_its_knobs_make(tmp_path: Path) -> None:
    import requests

    with FakeComfy(base_directory=tmp_path / "f", without_nodes=["ImageBlur"],
                   choices={"CheckpointLoaderSimple.ckpt_name": ["a.safetensors"]}) as fake:
        info = _object_info(fake.url)
        assert "ImageBlur" not in info and "ImageInvert" in info
        assert info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] == ["a.safetensors"]
        posted = requests.post(f"{fake.url}/prompt", json={"prompt": BLURLESS}, timeout=5)
        assert posted.status_code == 400
        assert "ImageBlur" in posted.json()["error"]["message"]
        fake.options.without_nodes = []  # changed live, as a restart with the custom node installed
        assert "ImageBlur" in _object_info(fake.url)
