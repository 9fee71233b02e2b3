"""At submit: {"url": ...} inputs fetched once into the asset store, with the webhooks'
refusal of private addresses (also after a redirect), a size bound, timeouts, bounded redirects and an expected
hash checked; every problem reported as file:line; the staging files removed after the submit."""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest
from input_server import elapsed, file_server, silent_port

from comfysup import assets, destinations, records, safehttp
from comfysup.config import InputsConfig
from comfysup.jobs import JobsFile
from comfysup.queue.sqlite import SQLiteQueue

WORKFLOW = {
    "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder.png"}},
    "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "inv"}},
}
DATA = b"\x89PNG a cat" * 1000
PRIVATE_OK = InputsConfig(allow_private=True, timeout_seconds=5.0)


def job_id(n: int) -> str:
    return str(uuid.UUID(int=n))


def write_jobs(folder: Path, lines: list[dict]) -> Path:
    (folder / "wf.json").write_text(json.dumps(WORKFLOW))
    path = folder / "jobs.jsonl"
    path.write_text("".join(json.dumps({"workflow": "wf.json", **line}) + "\n" for line in lines))
    return path


def url_line(n: int, value: dict) -> dict:
    return {"id": job_id(n), "set": {"1.image": value}}


def problems(path: Path, **kwargs) -> list[str]:
    jobs = JobsFile(path, **kwargs)
    try:
        return [f"{p.line}: {p.message}" for p in jobs.validate().problems]
    finally:
        jobs.close()


def test_a_url_input_is_fetched_once_stored_and_its_staging_removed(tmp_path: Path) -> None:
    with file_server(files={"/photos/cat.png": DATA}) as server:
        lines = [url_line(n, {"url": f"{server.url}/photos/cat.png"}) for n in range(1, 21)]
        path = write_jobs(tmp_path, lines)
        q = SQLiteQueue(tmp_path / "var" / "queue.db")
        jobs = JobsFile(path, remote=PRIVATE_OK)
        try:
            assert jobs.validate().ok
            staged = jobs.inputs._staging
            assert staged is not None and os.listdir(staged) == ["0"]
            assert q.intake.submit(jobs.jobs()).inserted == 20
        finally:
            jobs.close()
        assert not os.path.exists(staged)  # removed once the jobs are in
        assert server.got == ["/photos/cat.png"]  # twenty lines, one download
    digest = assets.hash_bytes(DATA)
    ref = q.reads.get(job_id(5)).params["1.image"]
    assert assets.ref_hash(ref) == digest and assets.ref_name(ref) == "cat.png" and ref["info"]["size"] == len(DATA)
    assert q.assets.read_asset(digest) == DATA
    q.close()


def test_a_private_address_is_refused_without_allow_private_and_nothing_is_fetched(tmp_path: Path) -> None:
    with file_server(files={"/cat.png": DATA}) as server:
        path = write_jobs(tmp_path, [url_line(1, {"url": f"{server.url}/cat.png"}),
                                     url_line(2, {"url": "http://169.254.169.254/latest/meta-data/"}),
                                     url_line(3, {"url": "http://metadata.azure.com/x.png"}),
                                     url_line(4, {"url": "https://user:pw@files.example/x.png"})])
        found = problems(path)
        assert server.got == []
    assert "1: set '1.image': http://127.0.0.1:" in found[0] and "127.0.0.1 is a loopback address; set " \
        "[inputs] allow_private = true" in found[0], found
    assert "169.254.169.254 is a link-local address" in found[1] and "meta-data" not in found[1]
    assert "metadata.azure.com is a cloud metadata service" in found[2]
    assert "carries credentials" in found[3] and "pw" not in found[3]


@pytest.fixture
def loopback_is_public(monkeypatch: pytest.MonkeyPatch) -> None:
    """127.0.0.1 stands for a public host (the test's server); every other private address stays refused."""
    real = destinations.address_problem

    def problem(address: str) -> str | None:
        return None if address == "127.0.0.1" else real(address)

    monkeypatch.setattr(destinations, "address_problem", problem)
    monkeypatch.setattr(safehttp, "address_problem", problem)


@pytest.mark.usefixtures("loopback_is_public")
def test_a_redirect_to_a_private_address_is_refused_each_hop_checked(tmp_path: Path) -> None:
    with file_server(files={"/cat.png": DATA}) as server:
        server.redirects = {"/literal": f"http://127.0.0.2:{server.port}/cat.png",
                            "/name": f"http://2130706434:{server.port}/cat.png",  # a name that is 127.0.0.2
                            "/metadata": "http://169.254.169.254/latest/meta-data/iam",
                            "/fine": "/cat.png"}
        path = write_jobs(tmp_path, [url_line(n, {"url": f"{server.url}/{hop}"})
                                     for n, hop in enumerate(("literal", "name", "metadata", "fine"), start=1)])
        found = problems(path)
        assert sorted(server.got) == ["/cat.png", "/fine", "/literal", "/metadata", "/name"]
    assert len(found) == 3, found
    assert found[0].startswith("1: ") and "127.0.0.2 is a loopback address" in found[0]
    assert found[1].startswith("2: ") and "refused to connect to 2130706434: 127.0.0.2 is a loopback address" \
        in found[1]
    assert found[2].startswith("3: ") and "169.254.169.254 is a link-local address" in found[2]


def test_a_hostile_servers_answers_are_clear_errors_not_tracebacks(tmp_path: Path) -> None:
    """A Location that is no URL, a Content-Length of digits Python reads as digits but int() does not (latin-1's
    superscript two): each is the line's problem, not an exception out of submit (or a broker's redelivery loop)."""
    with file_server() as server:
        server.raw = {"/ipv6": b"HTTP/1.1 302 Found\r\nLocation: http://[oops/x.png\r\nConnection: close\r\n\r\n",
                      "/length": b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\nConnection: close\r\n\r\nab"}
        path = write_jobs(tmp_path, [url_line(1, {"url": f"{server.url}/ipv6"}),
                                     url_line(2, {"url": f"{server.url}/length"})])
        jobs = JobsFile(path, remote=PRIVATE_OK)
        try:
            found = [f"{p.line}: {p.message}" for p in jobs.validate().problems]
            fetched = jobs.inputs._fetched[f"{server.url}/length"]  # an unreadable length is none: read to the end
        finally:
            jobs.close()
    assert len(found) == 1 and found[0].startswith("1: ") and "its answer cannot be read (Invalid IPv6 URL)" in found[0]
    assert not isinstance(fetched, str) and fetched.size == 2


def test_a_compressed_answer_is_refused_not_stored_compressed(tmp_path: Path) -> None:
    """Asked for identity, a server that compresses anyway would have its gzip bytes stored as the image."""
    import gzip

    packed = gzip.compress(DATA)
    with file_server() as server:
        server.raw = {"/cat.png": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nConnection: close\r\n"
                                  + f"Content-Length: {len(packed)}\r\n\r\n".encode() + packed}
        path = write_jobs(tmp_path, [url_line(1, {"url": f"{server.url}/cat.png"})])
        found = problems(path, remote=PRIVATE_OK)
    assert len(found) == 1 and "sent it encoded (Content-Encoding: gzip)" in found[0], found


def test_a_line_stops_fetching_once_its_inputs_pass_the_jobs_bound(tmp_path: Path) -> None:
    """[assets] max_job_mb bounds what one line makes comfysup download, not only what it stores: a line of many
    URLs, each under max_file_mb, is refused once their sum passes the bound, and the rest are not fetched."""
    files = {f"/{n}.png": bytes([n]) * 3000 for n in range(3)}
    with file_server(files=files) as server:
        value = {f"{node}.{key}": {"url": f"{server.url}/{n}.png"}
                 for n, (node, key) in enumerate((("1", "image"), ("2", "image"), ("3", "filename_prefix")))}
        path = write_jobs(tmp_path, [{"id": job_id(1), "set": value}])
        found = problems(path, remote=PRIVATE_OK, max_input_bytes=4000, max_job_input_bytes=5000)
        assert server.got == ["/0.png", "/1.png"]
    assert any("the job's input files are 6,000 bytes together; at most 5,000" in f for f in found), found


def test_redirects_are_bounded(tmp_path: Path) -> None:
    with file_server() as server:
        server.redirects = {"/a": "/b", "/b": "/a"}
        path = write_jobs(tmp_path, [url_line(1, {"url": f"{server.url}/a"})])
        found = problems(path, remote=records.replace(PRIVATE_OK, max_redirects=3))
        assert len(server.got) == 4
    assert "more than 3 redirects ([inputs] max_redirects)" in found[0]


def test_the_size_bound_with_and_without_a_content_length(tmp_path: Path) -> None:
    with file_server(files={"/big.png": b"x" * 5000}, unsized={"/stream.png": b"y" * 5000}) as server:
        path = write_jobs(tmp_path, [url_line(1, {"url": f"{server.url}/big.png"}),
                                     url_line(2, {"url": f"{server.url}/stream.png"})])
        found = problems(path, remote=PRIVATE_OK, max_input_bytes=4000)
    assert "is 5,000 bytes; an input file may have at most 4,000 bytes ([assets] max_file_mb)" in found[0]
    assert "an input file may have at most 4,000 bytes" in found[1]


def test_a_server_that_never_answers_fails_after_the_timeout(tmp_path: Path) -> None:
    with silent_port() as port:
        path = write_jobs(tmp_path, [url_line(n, {"url": f"http://127.0.0.1:{port}/cat.png"}) for n in (1, 2)])
        found, took = elapsed(problems, path, remote=records.replace(PRIVATE_OK, timeout_seconds=0.3))
    assert "no answer within 0.3 s ([inputs] timeout_seconds)" in found[0] and found[0] == "1" + found[1][1:]
    assert took < 5  # once for both lines: a failure is remembered


def test_a_jobs_downloads_together_are_bounded_by_max_seconds(tmp_path: Path) -> None:
    """Many URLs of one line (a broker message, an API workflow) to a server that never answers: each waits its
    timeout_seconds, but together no longer than max_seconds; the ones after it are not tried."""
    with silent_port() as port:
        value = {f"{node}.{key}": {"url": f"http://127.0.0.1:{port}/{n}.png"}
                 for n, (node, key) in enumerate((("1", "image"), ("2", "image"), ("3", "filename_prefix")))}
        path = write_jobs(tmp_path, [{"id": job_id(1), "set": value}])
        settings = records.replace(PRIVATE_OK, timeout_seconds=0.4, max_seconds=0.6)
        found = problems(path, remote=settings)
    assert sum("no answer within 0.4 s" in f for f in found) == 2, found
    assert any("/…: not fetched: the job's inputs took more than 0.6 s together ([inputs] max_seconds)" in f
               for f in found), found


def test_a_trickle_is_cut_at_the_whole_download_bound(tmp_path: Path) -> None:
    with file_server() as server:
        path = write_jobs(tmp_path, [url_line(1, {"url": f"{server.url}/trickle"})])
        found, took = elapsed(problems, path, remote=records.replace(PRIVATE_OK, max_seconds=0.5))
    assert "not fetched within 0.5 s ([inputs] max_seconds)" in found[0]
    assert took < 5


def test_a_core_asset_reference_may_carry_a_url(tmp_path: Path) -> None:
    with file_server(files={"/cat.png": DATA}) as server:
        ref = {"__type": "core/ASSET", "info": {"url": f"{server.url}/cat.png", "file_path": "photo.png",
                                                "hash": assets.hash_bytes(DATA)}}
        wrong = {"__type": "core/ASSET", "info": {"url": f"{server.url}/cat.png", "hash": "sha256:" + "0" * 64}}
        path = write_jobs(tmp_path, [url_line(1, ref), url_line(2, wrong)])
        jobs = JobsFile(path, remote=PRIVATE_OK)
        try:
            found = [f"{p.line}: {p.message}" for p in jobs.validate().problems]
            job = next(jobs.jobs())  # the first line's
        finally:
            jobs.close()
    assert len(found) == 1 and found[0].startswith("2: ") and "not the expected" in found[0], found
    ref = job.params["1.image"]
    assert assets.ref_name(ref) == "photo.png" and assets.ref_hash(ref) == assets.hash_bytes(DATA)


def test_an_expected_hash_is_checked_and_every_problem_of_a_line_reported(tmp_path: Path) -> None:
    sha = hashlib.sha256(DATA).hexdigest()
    b3 = assets.hash_bytes(DATA)
    with file_server(files={"/cat.png": DATA}) as server:
        url = f"{server.url}/cat.png"
        path = write_jobs(tmp_path, [
            url_line(1, {"url": url, "blake3": b3, "name": "kitten.png"}),  # fetched here, without its SHA-256
            url_line(2, {"url": url, "sha256": "0" * 64}),  # which is computed from the staged file for this line
            {"id": job_id(3), "set": {"1.image": {"url": url, "blake3": "blake3:" + "1" * 64},
                                      "3.filename_prefix": {"url": f"{server.url}/missing.png"}}},
            url_line(4, {"url": f"{server.url}/other.png", "sha-256": "x"}),
            url_line(5, {"url": url, "sha256": sha, "blake3": b3}),
        ])
        found = problems(path, remote=PRIVATE_OK)
        assert "/other.png" not in server.got  # a line whose reference is wrong fetches nothing
        assert server.got.count("/cat.png") == 1
    assert found[0].startswith("2: ") and f"has sha256 {sha}, not the expected {'0' * 64}" in found[0]
    line3 = [f for f in found if f.startswith("3: ")]
    assert len(line3) == 2, found
    assert "has blake3" in line3[0] and "3.filename_prefix" in line3[1] and "HTTP 404" in line3[1]
    assert found[3].startswith("4: ") and "unknown key 'sha-256'" in found[3] and "did you mean 'sha256'" in found[3]
    assert len(found) == 4


def test_the_shape_of_an_input_from_elsewhere_is_checked(tmp_path: Path) -> None:
    path = write_jobs(tmp_path, [url_line(1, {"url": 7}), url_line(2, {"url": "ftp://files.example/a.png"}),
                                 url_line(3, {"url": "s3://bucket/a.png"}),
                                 url_line(4, {"url": "https://files.example/a.png", "s3": "s3://b/k"}),
                                 url_line(5, {"url": "https://files.example/a.png", "name": "../x.png"}),
                                 url_line(6, {"s3": "s3://bucket-only"}),
                                 url_line(7, {"url": "http://[::1/cat.png"})])  # no URL: urlsplit's ValueError
    found = problems(path)
    assert '1: set \'1.image\': "url" must be an https:// URL' in found[0]
    assert "2: " in found[1] and "not an http:// or https:// URL" in found[1]
    assert "write {\"s3\": \"s3://…\"} for a bucket" in found[2]
    assert "give \"url\" or \"s3\", not both" in found[3]
    assert "\"name\" must be a file name" in found[4]
    assert "is not s3://bucket/key" in found[5]
    assert found[6].startswith("7: ") and "url (unreadable url) is not an http:// or https:// URL" in found[6], found


@pytest.mark.parametrize(("text", "expected"), [
    ("timeout_seconds = 0", "[inputs] timeout_seconds = 0.0: must be a number of seconds greater than 0"),
    ("max_redirects = 50", "[inputs] max_redirects = 50: must be between 0 and 20"),
    ('s3_endpoint_url = "minio:9000"', "expected an http:// or https:// URL of an S3 service"),
    ('s3_buckets = ["s3://b"]', "[inputs] s3_buckets = 's3://b': expected bucket names"),
    ("allow_privat = true", "allow_privat"),
])
def test_impossible_inputs_settings_are_refused_at_start(tmp_path: Path, text: str, expected: str) -> None:
    from comfysup.config import load_config
    from comfysup.errors import ConfigError

    path = tmp_path / "config.toml"
    path.write_text(f"[inputs]\n{text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    assert expected in str(info.value) and str(path) in str(info.value)


def test_a_held_blake3_is_not_fetched_again(tmp_path: Path) -> None:
    """A line that names its content by blake3 and whose content the store holds (the same file submitted again,
    its URL since gone) is not fetched: the job names the stored content, as an upload's reference does."""
    digest = assets.hash_bytes(DATA)
    q = SQLiteQueue(tmp_path / "queue.db")
    with file_server(files={"/cat.png": DATA}) as server:
        url = f"{server.url}/cat.png"
        path = write_jobs(tmp_path, [url_line(1, {"url": url, "blake3": digest})])
        jobs = JobsFile(path, remote=PRIVATE_OK)
        jobs.inputs.stored = q.assets.asset_size
        try:
            assert jobs.validate().ok and q.intake.submit(jobs.jobs()).inserted == 1
        finally:
            jobs.close()
        assert server.got == ["/cat.png"]
    sha = hashlib.sha256(DATA).hexdigest()  # a sha256 to check is checked: that line is fetched, and fails
    path = write_jobs(tmp_path, [url_line(1, {"url": url, "blake3": digest}),
                                 url_line(2, {"url": url, "blake3": digest, "name": "again.png"}),
                                 url_line(3, {"url": url, "blake3": digest, "sha256": sha})])
    jobs = JobsFile(path, remote=PRIVATE_OK)
    jobs.inputs.stored = q.assets.asset_size
    try:
        found = [f"{p.line}: {p.message}" for p in jobs.validate().problems]
        assert len(found) == 1 and found[0].startswith("3: ") and "cannot connect" in found[0], found
    finally:
        jobs.close()
    jobs = JobsFile(write_jobs(tmp_path, [url_line(n, {"url": url, "blake3": digest}) for n in (1, 2)]),
                    remote=PRIVATE_OK)
    jobs.inputs.stored = q.assets.asset_size
    try:
        assert jobs.validate().ok
        result = q.intake.submit(jobs.jobs())
    finally:
        jobs.close()
    assert (result.inserted, result.existing) == (1, 1)  # the same job again: nothing new
    assert assets.ref_hash(q.reads.get(job_id(2)).params["1.image"]) == digest
    q.close()


def test_the_forked_reader_of_a_large_submit_uses_what_validation_fetched(tmp_path: Path) -> None:
    """A large file is read a second time by a forked child while the parent inserts (jobs_read_ahead): the
    child finds every input in the parent's staging, fetches nothing, and leaves the staging to the parent."""
    with file_server(files={"/cat.png": DATA}) as server:
        path = write_jobs(tmp_path, [url_line(n, {"url": f"{server.url}/cat.png"}) for n in range(1, 6)])
        jobs = JobsFile(path, remote=PRIVATE_OK)
        assert jobs.validate().ok
    q = SQLiteQueue(tmp_path / "queue.db")
    try:
        assert q.intake.submit(jobs.jobs_read_ahead(batch=2)).inserted == 5  # the server is gone: nothing fetched again
        staged = jobs.inputs._staging
        assert staged is not None and os.path.isdir(staged)  # the child did not remove the parent's staging
    finally:
        jobs.close()
    assert not os.path.exists(staged)
    assert q.assets.read_asset(assets.hash_bytes(DATA)) == DATA
    q.close()


def test_a_line_submitted_again_after_its_urls_content_changed_is_the_same_job(tmp_path: Path) -> None:
    """A job is named by its line as written: an input by URL by its reference (the URL, any expected hash), never
    by the bytes fetched. A redelivered broker message or a resubmitted file whose URL now serves other bytes is
    the job already submitted (it keeps the first bytes), neither a second job nor a conflict."""
    q = SQLiteQueue(tmp_path / "queue.db")
    with file_server(files={"/cat.png": DATA}) as server:
        url = f"{server.url}/cat.png"
        path = write_jobs(tmp_path, [{"set": {"1.image": {"url": url}}}, url_line(1, {"url": url, "name": "c.png"})])
        results = []
        for data in (DATA, DATA + b"changed"):
            server.files["/cat.png"] = data
            jobs = JobsFile(path, remote=PRIVATE_OK)
            try:
                assert jobs.validate().ok
                results.append(q.intake.submit(list(jobs.jobs())))
            finally:
                jobs.close()
        assert server.got == ["/cat.png", "/cat.png"]  # fetched each time: the new bytes were seen
    assert [(r.inserted, r.existing) for r in results] == [(2, 0), (0, 2)]
    assert {assets.ref_hash(job.params["1.image"]) for job in q.reads.iter_jobs()} == {assets.hash_bytes(DATA)}
    q.close()
