"""JobsFile without the command: what a parsed job holds, and that the shared-template shortcut is exact.

Lines that name one workflow file share its parsed nodes and their encoded text; these tests pin that a
job's stored text and spec_hash are exactly what encoding the applied workflow would give (so resubmits
stay idempotent across versions), that one line's ``set`` never leaks into another's, and that a ``set``
which adds a link is still checked in full.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from cli_support import TRIVIAL, job_id, line, write_jobs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from comfysup import records
from comfysup.errors import ComfysupError
from comfysup.jobs import JobsFile
from comfysup.queue.base import NewJob
from comfysup.queue.sqlite import SQLiteQueue


def expected_hash(workflow: dict, extra: dict, meta: dict, priority: int) -> str:
    digest = hashlib.sha256()
    for part in (json.dumps(workflow, sort_keys=True, separators=(",", ":")), json.dumps(extra, sort_keys=True),
                 json.dumps(meta, sort_keys=True), str(priority)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def test_text_and_hash_are_those_of_the_applied_workflow(tmp_path: Path) -> None:
    overrides = [{"1.color": 5, "3.filename_prefix": "a"}, {}, {"2.image": ["1", 0], "1.width": 8},
                 {"1.color": {"nested": ["x", 1]}}]
    lines = [line(n, set=o, meta={"n": n}, extra_data={"k": "v"}, priority=n) for n, o in enumerate(overrides)]
    path = write_jobs(tmp_path, lines)
    jobs = JobsFile(path)
    assert jobs.validate().ok
    for n, (job, o) in enumerate(zip(jobs.jobs(), overrides, strict=True)):
        applied = copy.deepcopy(TRIVIAL)
        for key, value in o.items():
            node, _, name = key.rpartition(".")
            applied[node]["inputs"][name] = value
        assert job.workflow == applied
        # The text is hashed from the template's saved states, never built whole: the hash must still be the
        # full text's (the queue stores the template and the set, and rebuilds the workflow from them).
        assert job.spec_hash == expected_hash(applied, {"k": "v"}, {"n": n}, n)
        assert job.params == o


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(overrides=st.dictionaries(st.sampled_from(["1.color", "1.width", "3.filename_prefix", "2.image", "1.new_input",
                                                  "3.images"]), _VALUES, max_size=4),
       title=st.text())
def test_a_changed_nodes_text_is_assembled_exactly_as_json_encodes_it(overrides: dict, title: str) -> None:
    """Template builds a changed node's text from its inputs' texts (only the changed values encoded
    again); whatever the values, that text, and so the spec hash, must be the applied workflow's own."""
    from comfysup.jobs import ObjectInfo, Template, apply_set

    workflow = copy.deepcopy(TRIVIAL)
    workflow["1"]["_meta"] = {"title": title}  # keys before and after "inputs", with any text in them
    workflow["3"]["z_after"] = ["x", 1]
    template = Template(workflow, "w")
    changed = apply_set(workflow, overrides, ObjectInfo({"EmptyImage": {"input": {"optional": {"new_input": {}}}}}))
    applied = {**workflow, **changed}
    text = json.dumps(applied, sort_keys=True, separators=(",", ":"))
    assert template.text(changed) == text
    assert template.hasher(changed).hexdigest() == hashlib.sha256(text.encode()).hexdigest()


def test_one_lines_set_does_not_leak_into_the_next(tmp_path: Path) -> None:
    path = write_jobs(tmp_path, [line(1, set={"1.color": 111}), line(2, set={})])
    first, second = JobsFile(path).jobs()
    assert first.workflow["1"]["inputs"]["color"] == 111
    assert second.workflow == TRIVIAL


def test_inline_and_file_workflows_hash_alike(tmp_path: Path) -> None:
    path = write_jobs(tmp_path, [line(1, set={"1.color": 3}), line(1, workflow=TRIVIAL, set={"1.color": 3})])
    a, b = (JobsFile(path).parse(raw, check=True)[0] for raw in path.read_bytes().splitlines())
    assert a.workflow == b.workflow
    assert a.spec_hash == b.spec_hash
    assert (a.workflow_name, b.workflow_name) == ("wf", "inline")


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"2.image": ["9", 0]}, "input 'image' links to node '9', which is not in the workflow"),
    ({"1.color": ["2", 0]}, "the workflow has a cycle"),
])
def test_a_set_that_adds_a_link_is_checked_in_full(tmp_path: Path, overrides: dict, reason: str) -> None:
    path = write_jobs(tmp_path, [line(1, set={"1.color": 1}), line(2, set=overrides)])
    result = JobsFile(path).validate()
    assert [(p.line, reason in p.message) for p in result.problems] == [(2, True)]


def test_a_set_can_repair_a_broken_file_and_the_file_alone_stays_broken(tmp_path: Path) -> None:
    broken = copy.deepcopy(TRIVIAL)
    broken["2"]["inputs"]["image"] = ["7", 0]
    path = write_jobs(tmp_path, [line(1, set={}), line(2, set={"2.image": ["1", 0]})], workflow=broken)
    result = JobsFile(path).validate()
    assert [p.line for p in result.problems] == [1]
    assert "links to node '7'" in result.problems[0].message


@pytest.mark.parametrize("bad", [[], "x", 0])
def test_set_must_be_an_object_even_when_empty(tmp_path: Path, bad: object) -> None:
    path = write_jobs(tmp_path, [line(1, set=bad)])
    result = JobsFile(path).validate()
    assert [p.line for p in result.problems] == [1]
    assert "set must be an object" in result.problems[0].message


def test_the_ids_and_lines_are_recorded(tmp_path: Path) -> None:
    path = write_jobs(tmp_path, [line(1), "", line(2)])
    result = JobsFile(path).validate()
    assert result.count == 2
    assert result.lines_by_id == {job_id(1): 1, job_id(2): 3}


def test_a_callback_url_is_kept_checked_and_part_of_the_hash_only_when_given(tmp_path: Path) -> None:
    hook = "https://hooks.example/comfysup?team=7"
    path = write_jobs(tmp_path, [line(1), line(2, callback_url=hook)])
    plain, hooked = list(JobsFile(path).jobs())
    assert (plain.callback_url, hooked.callback_url) == ("", hook)
    applied = copy.deepcopy(TRIVIAL)
    applied["1"]["inputs"]["color"] = 1
    assert plain.spec_hash == expected_hash(applied, {}, {}, 0)  # files without one keep their old hashes
    again = next(iter(JobsFile(write_jobs(tmp_path, [line(2)], name="again.jsonl")).jobs()))
    assert again.spec_hash != hooked.spec_hash  # a changed webhook is changed content for the same id
    bad = write_jobs(tmp_path, [line(3, callback_url="file:///etc/passwd"), line(4, callback_url=7)], name="bad.jsonl")
    problems = [p.message for p in JobsFile(bad).validate().problems]
    assert problems == ["callback_url 'file:///etc/passwd' is not an http:// or https:// URL with a host",
                        "callback_url must be an http:// or https:// URL of at most 2048 characters"]


LOADED = {
    "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sdxl.safetensors"}},
    "2": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "comfysup"}},
}


def test_the_queue_stores_the_template_once_and_claims_exactly_the_applied_workflow(tmp_path: Path) -> None:
    """What ComfyUI receives after the queue rebuilt it from the stored template and the line's ``set`` is,
    byte for byte once encoded, the workflow submit applied; a batch of one file is one stored workflow."""
    from comfysup.queue.sqlite import SQLiteQueue
    from comfysup.workflows import model_key

    lines = [line(n, set={"2.color": n, "3.filename_prefix": f"p{n}"}) for n in range(5)]
    lines.append(line(5, set={"1.ckpt_name": "flux.safetensors"}))  # a set that changes the model
    lines.append(line(6, workflow=LOADED, set={"2.color": 6}))  # inline, with a set
    lines.append(line(7, workflow=LOADED, set={"2.color": 7}))  # the same inline workflow again
    path = write_jobs(tmp_path, lines, workflow=LOADED)
    jobs_file = JobsFile(path)
    assert jobs_file.validate().ok
    jobs = list(jobs_file.jobs())
    assert len({j.template_hash for j in jobs}) == 1  # the file and the inline copies: one text
    assert [j.model_key for j in jobs] == [model_key(LOADED)] * 5 + [model_key(
        {**LOADED, "1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "flux.safetensors"}}}),
        model_key(LOADED), model_key(LOADED)]
    q = SQLiteQueue(tmp_path / "q.db")
    q.intake.submit(jobs)
    assert q.db._read("SELECT count(*) FROM workflows")[0][0] == 1
    for job in jobs:
        claim = q.leases.claim("r", "gpu0", 30)
        assert claim is not None and claim.id == job.id and claim.model_key == job.model_key
        assert json.dumps(claim.workflow, sort_keys=True, separators=(",", ":")) == \
            json.dumps(job.workflow, sort_keys=True, separators=(",", ":"))
    q.close()


def _mixed_file(tmp_path: Path, n: int) -> Path:
    """Lines of the shared file workflow and inline ones, with extra data, meta, priorities and callbacks."""
    lines = []
    for i in range(n):
        if i % 7 == 3:
            inline = copy.deepcopy(TRIVIAL)
            inline["1"]["inputs"]["width"] = 8 + i
            lines.append(line(i, workflow=inline, meta={"i": i}))
        else:
            lines.append(line(i, priority=i % 3, extra_data={"k": str(i)} if i % 5 == 0 else {},
                              callback_url="http://hooks.example:9/hook" if i % 11 == 0 else ""))
    return write_jobs(tmp_path, lines)


def test_the_read_ahead_yields_the_jobs_that_jobs_builds_workflow_aside(tmp_path: Path) -> None:
    jobs = JobsFile(_mixed_file(tmp_path, 1234))
    assert jobs.validate().ok
    fields = [f.name for f in records.fields(NewJob) if f.name != "workflow"]
    direct = [tuple(getattr(j, f) for f in fields) for j in jobs.jobs()]
    ahead = list(jobs.jobs_read_ahead(batch=100))
    assert [tuple(getattr(j, f) for f in fields) for j in ahead] == direct
    assert len(direct) == 1234 and all(not j.workflow for j in ahead)


def test_a_read_ahead_submit_stores_what_a_plain_one_stores(tmp_path: Path) -> None:
    jobs = JobsFile(_mixed_file(tmp_path, 600))
    plain, ahead = SQLiteQueue(tmp_path / "a.db"), SQLiteQueue(tmp_path / "b.db")
    assert plain.intake.submit(jobs.jobs()).inserted == ahead.intake.submit(jobs.jobs_read_ahead(batch=64)).inserted \
        == 600
    for a, b in zip(plain.reads.iter_jobs(), ahead.reads.iter_jobs(), strict=True):
        assert (a.id, a.workflow, a.extra_data, a.meta, a.params, a.priority, a.workflow_name) == (
            b.id, b.workflow, b.extra_data, b.meta, b.params, b.priority, b.workflow_name)
    assert ahead.intake.submit(jobs.jobs_read_ahead()).existing == 600  # the same spec hashes: nothing twice
    plain.close()
    ahead.close()


@pytest.mark.parametrize("how", ["dies", "raises"])
def test_a_reader_that_fails_leaves_nothing_inserted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     how: str) -> None:
    """The child reads the file; if it dies (killed, out of memory) or fails half-way, the submit raises in
    its transaction and rolls back, whatever it had inserted already."""
    jobs = JobsFile(_mixed_file(tmp_path, 300))
    original = JobsFile.jobs

    def failing(self: JobsFile) -> Any:  # runs in the forked child
        for n, job in enumerate(original(self)):
            if n == 150:
                if how == "dies":
                    os._exit(3)
                raise OSError("disk read error")
            yield job

    monkeypatch.setattr(JobsFile, "jobs", failing)
    queue = SQLiteQueue(tmp_path / "q.db")
    with pytest.raises(ComfysupError, match="exit code 3" if how == "dies" else "OSError: disk read error"):
        queue.intake.submit(jobs.jobs_read_ahead(batch=50))
    assert queue.reads.status().counts["queued"] == 0
    queue.close()


def test_an_input_from_elsewhere_names_its_job_as_written_and_a_file_by_its_content() -> None:
    from comfysup.jobs.identity import as_written

    ref = {"__type": "core/ASSET", "info": {"hash": "blake3:" + "a" * 64, "file_path": "x.png"}}
    written = {"1.image": {"url": "https://files.example/cat.png", "sha256": "b" * 64}, "2.image": {"file": "c.png"},
               "3.mask": {"__type": "core/ASSET", "info": {"url": "s3://in/m.png"}}, "4.seed": 5, "5.image": ref}
    resolved = {**written, "1.image": ref, "2.image": ref, "3.mask": ref}
    assert as_written(written, resolved) == {**resolved, "1.image": written["1.image"], "3.mask": written["3.mask"]}
    plain = {"2.image": ref, "4.seed": 5}
    assert as_written({"2.image": {"file": "c.png"}, "4.seed": 5}, plain) is plain  # ids of such lines unchanged
