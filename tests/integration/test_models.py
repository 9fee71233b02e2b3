"""The model manifest: ``comfysup models pull`` fetches each file once into the cache, continues an
interrupted download instead of starting over, refuses a wrong hash, lets a second machine on the same cache fetch
nothing, and a server launched with the cache lists the file. Model files are served on loopback by the test,
which counts every byte it sends."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from comfysup.config import load_config
from comfysup.gpus import Slot
from comfysup.supervisor import server
from tests.cli_support import REPO, cli
from tests.models_support import MODEL, FileServer, content, entry, write_config
from tests.port_support import server_port

SIZE = (3 << 20) + 12345
"""Three 1 MiB chunks and a bit: a download held after two whole chunks has written exactly those to disk."""


def blob(cache: Path, data: bytes) -> Path:
    return cache / "sha256" / hashlib.sha256(data).hexdigest()


def test_pull_fetches_verifies_links_and_lists(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = content(SIZE)
    with FileServer({"/m/a.safetensors": data}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/m/a.safetensors", data, name="sd/a.safetensors")])
        code, out, err = cli(capsys, "models", "--config", str(config), "list")  # --config before the action too
        assert code == 1 and "checkpoints/sd/a.safetensors" in out and "missing" in out
        code, out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 0, err
        assert "0 already cached, 1 fetched" in out
        assert files.sent["/m/a.safetensors"] == SIZE
    cache = tmp_path / "var" / "model-cache"
    assert blob(cache, data).read_bytes() == data
    link = tmp_path / "var" / "comfyui" / "models" / "checkpoints" / "sd" / "a.safetensors"
    assert link.is_symlink() and link.resolve() == blob(cache, data)
    assert not list((cache / "partial").glob("*[!k]"))  # only the lock file: no partial left behind
    code, out, _ = cli(capsys, "models", "list", "--config", str(config), "--json")
    assert code == 0
    row = json.loads(out)
    assert row["state"] == "verified" and row["size"] == SIZE and row["sha256"] == hashlib.sha256(data).hexdigest()
    assert row["linked"] is True


@pytest.mark.parametrize(("how", "said"), [("cut", "broke off after 2097152 bytes"), ("stall", "no bytes for 0.5 s")])
def test_a_broken_off_download_continues_where_it_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch, how: str,
                                                          said: str) -> None:
    """The connection closed after 2 MiB, or no byte after them for the read timeout (never a hang): the pull
    continues from there at once, and every byte is sent once."""
    from comfysup.models import sources

    monkeypatch.setattr(sources, "READ_TIMEOUT", 0.5)
    data = content(SIZE, seed=2)
    with FileServer({"/a": data}, **{"cut_after" if how == "cut" else "hold_after": {"/a": 2 << 20}}).serving() \
            as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", data)])
        code, out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 0, err
        assert said in out
        assert files.ranges == ["", f"bytes={2 << 20}-"]
        assert files.sent["/a"] == SIZE  # every byte once
    assert blob(tmp_path / "var" / "model-cache", data).read_bytes() == data


def test_a_killed_pull_is_continued_by_the_next_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = content(SIZE, seed=3)
    with FileServer({"/a": data}, hold_after={"/a": 2 << 20}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", data)])
        env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}
        proc = subprocess.Popen([sys.executable, "-m", "comfysup", "models", "pull", "--config", str(config)],
                                env={**env, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            assert files.held.wait(20), "the first pull never got its first bytes"
            partial = tmp_path / "var" / "model-cache" / "partial" / hashlib.sha256(data).hexdigest()
            deadline = time.monotonic() + 20
            while not (partial.is_file() and partial.stat().st_size == 2 << 20):  # two whole chunks written
                assert time.monotonic() < deadline, "the partial file never held the bytes sent"
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(20)
        code, out, _ = cli(capsys, "models", "list", "--config", str(config))
        assert code == 1 and "partial" in out and "2.0 MiB" in out
        code, out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 0, err
        assert "continuing after 2.0 MiB" in out
        assert files.ranges[-1] == f"bytes={2 << 20}-"
        assert files.sent["/a"] == SIZE
    assert blob(tmp_path / "var" / "model-cache", data).read_bytes() == data


def test_a_wrong_hash_is_refused_and_nothing_is_left(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = content(1000, seed=4)
    wrong = entry("", content(1000, seed=5))["sha256"]
    with FileServer({"/a": data}).serving() as files:
        config = write_config(tmp_path, [{**entry(f"{files.url}/a", data), "sha256": wrong}])
        code, out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
    assert code == 1
    assert f"checkpoints/{MODEL}" in err and f"has sha256 {hashlib.sha256(data).hexdigest()}" in err
    assert "it was removed" in err
    cache = tmp_path / "var" / "model-cache"
    assert not (cache / "sha256").exists() or not any((cache / "sha256").iterdir())
    assert not (cache / "partial" / wrong).exists()
    assert not (tmp_path / "var" / "comfyui" / "models" / "checkpoints" / MODEL).exists()
    code, out, _ = cli(capsys, "models", "list", "--config", str(config))
    assert code == 1 and "missing" in out


def test_a_second_machine_on_the_same_cache_fetches_nothing(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    data = content(5000, seed=6)
    shared = tmp_path / "nfs" / "models"
    with FileServer({"/a": data}).serving() as files:
        models = [entry(f"{files.url}/a", data)]
        first = write_config(tmp_path / "machine-a", models, cache=shared)
        second = write_config(tmp_path / "machine-b", models, cache=shared)
        assert cli(capsys, "models", "pull", "--config", str(first), "--no-progress")[0] == 0
        code, out, _ = cli(capsys, "models", "list", "--config", str(second))
        assert code == 1 and "verified, not linked: comfysup models pull links it" in out
        code, out, err = cli(capsys, "models", "pull", "--config", str(second), "--no-progress")
        assert code == 0, err
        assert "1 already cached, 0 fetched" in out
        assert files.sent["/a"] == len(data) and len(files.ranges) == 1
    link = tmp_path / "machine-b" / "var" / "comfyui" / "models" / "checkpoints" / MODEL
    assert link.read_bytes() == data


def test_a_local_file_is_copied_and_a_fifo_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = content(2000, seed=7)
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "lora.safetensors").write_bytes(data)
    os.mkfifo(tmp_path / "files" / "pipe.safetensors")
    snapshot = tmp_path / "hf" / "snapshots" / "main"  # Hugging Face's cache: each file a link into its blobs
    snapshot.mkdir(parents=True)
    (tmp_path / "hf" / "blob").write_bytes(b"vae")
    (snapshot / "vae.safetensors").symlink_to("../../blob")
    config = write_config(tmp_path, [entry("files/lora.safetensors", data, name="l.safetensors", folder="loras"),
                                     entry("files/pipe.safetensors", b"", name="p.safetensors", folder="loras"),
                                     entry(str(snapshot / "vae.safetensors"), b"vae", name="v.safetensors",
                                           folder="vae")])
    code, _out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
    assert code == 1
    assert "loras/p.safetensors" in err and "not a regular file" in err
    assert (tmp_path / "var" / "comfyui" / "models" / "loras" / "l.safetensors").read_bytes() == data
    assert (tmp_path / "var" / "comfyui" / "models" / "vae" / "v.safetensors").read_bytes() == b"vae"
    assert (tmp_path / "var" / "comfyui").stat().st_mode & 0o777 == 0o700  # as the servers' base directories


def test_a_launched_server_lists_the_cached_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The server's own extra_model_paths.yaml points it at the verified files: the fake (which reads the flag as
    ComfyUI does) lists the model as CheckpointLoaderSimple's choice and in /models/checkpoints."""
    data = content(3000, seed=8)
    with FileServer({"/a": data}).serving() as files:
        path = write_config(tmp_path, [entry(f"{files.url}/a", data)],
                            comfyui={"main": str(REPO / "fake_comfy" / "main.py"), "base_port": server_port()})
        assert cli(capsys, "models", "pull", "--config", str(path), "--no-progress")[0] == 0
    config = load_config(str(path), env={})
    plan = server.plan(config, Slot("cpu0", 0, None))
    server.prepare(plan)
    argv = list(plan.argv)
    assert argv[argv.index("--extra-model-paths-config") + 1] == str(plan.directory / "extra_model_paths.yaml")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            if "To see the GUI go to: " in line:
                url = line.split("go to: ")[1].strip()
                break
        assert url, "the fake did not start"
        info = requests.get(f"{url}/object_info/CheckpointLoaderSimple", timeout=10).json()
        choices = info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
        assert choices == [MODEL]
        assert requests.get(f"{url}/models/checkpoints", timeout=10).json() == [MODEL]
        assert requests.get(f"{url}/models/loras", timeout=10).json() == []
    finally:
        proc.kill()
        proc.wait(10)


def test_a_file_changed_at_the_source_is_fetched_whole_not_spliced(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A partial download of the old file is not continued with the new one's bytes: If-Range carries the ETag the
    first answer gave, and the server that has another file answers with all of it."""
    old, new = content(SIZE, seed=9), content(SIZE, seed=10)
    with FileServer({"/a": new}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", new)])
        # A pull killed after 1 MiB of the old file, as it leaves the cache: the bytes, and the first answer's ETag.
        partial = tmp_path / "var" / "model-cache" / "partial" / hashlib.sha256(new).hexdigest()
        partial.parent.mkdir(parents=True)
        partial.write_bytes(old[:1 << 20])
        partial.with_name(partial.name + ".json").write_text(
            json.dumps({"etag": f'"{hashlib.sha256(old).hexdigest()[:16]}"'}))
        code, _out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 0, err
        assert files.ranges == [f"bytes={1 << 20}-"] and files.sent["/a"] == SIZE  # asked to continue, sent whole
    assert blob(tmp_path / "var" / "model-cache", new).read_bytes() == new


def test_redirects_are_followed_a_few_times_and_missing_files_named(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    data = content(100, seed=11)
    loop = {f"/r{i}": f"/r{i + 1}" for i in range(10)}
    with FileServer({"/a": data}, redirects={"/cdn": "/a", **loop}).serving() as files:
        good = write_config(tmp_path / "good", [entry(f"{files.url}/cdn", data)])
        assert cli(capsys, "models", "pull", "--config", str(good), "--no-progress")[0] == 0
        looping = write_config(tmp_path / "loop", [entry(f"{files.url}/r0?token=secret", data, name="b.safetensors")])
        code, _, err = cli(capsys, "models", "pull", "--config", str(looping), "--no-progress")
        assert code == 1 and "more than 5 redirects" in err and "secret" not in err
        gone = write_config(tmp_path / "gone", [entry(f"{files.url}/nothing", data, name="c.safetensors")])
        code, _, err = cli(capsys, "models", "pull", "--config", str(gone), "--no-progress")
        assert code == 1 and "HTTP 404: no such file (check the url)" in err and "checkpoints/c.safetensors" in err


def test_two_pulls_at_once_fetch_one_copy(tmp_path: Path) -> None:
    """The second pull waits for the first one's lock on that file and then finds it cached: bytes sent once."""
    data = content(SIZE, seed=13)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")}, "PYTHONPATH": str(REPO)}
    with FileServer({"/a": data}, hold_after={"/a": 2 << 20}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", data)])
        command = [sys.executable, "-m", "comfysup", "models", "pull", "--config", str(config), "--no-progress"]
        first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        second = None
        try:
            assert files.held.wait(20), "the first pull never got its first bytes"
            second = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert second.stdout is not None
            waiting = next((line for line in second.stdout if "another pull is fetching it; waiting" in line), "")
            assert waiting, "the second pull did not wait for the first"
            files.release.set()
            out_first, _ = first.communicate(timeout=30)
            out_second, _ = second.communicate(timeout=30)
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        assert first.returncode == 0, out_first
        assert second.returncode == 0 and "1 already cached, 0 fetched" in out_second, out_second
        assert files.sent["/a"] == SIZE


def test_one_content_under_two_names_is_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = content(1000, seed=14)
    with FileServer({"/a": data}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", data, name="a.safetensors"),
                                         entry(f"{files.url}/a", data, name="b.safetensors", folder="loras")])
        assert cli(capsys, "models", "pull", "--config", str(config), "--no-progress")[0] == 0
        assert files.sent["/a"] == len(data)
    view = tmp_path / "var" / "comfyui" / "models"
    assert (view / "checkpoints" / "a.safetensors").resolve() == (view / "loras" / "b.safetensors").resolve()


def test_the_environments_proxy_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """models.invalid exists nowhere: only the proxy (the test's server, as http_proxy names it) can answer."""
    data = content(1000, seed=15)
    for name in ("no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    with FileServer({"/a": data}).serving() as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        config = write_config(tmp_path, [entry("http://models.invalid/a", data)])
        code, _, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 0, err
        assert proxy.proxied == 1 and proxy.sent["/a"] == len(data)


def test_verify_finds_a_cached_file_that_changed_and_pull_replaces_it(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    data = content(1000, seed=16)
    with FileServer({"/a": data}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", data)])
        assert cli(capsys, "models", "pull", "--config", str(config), "--no-progress")[0] == 0
        cached = blob(tmp_path / "var" / "model-cache", data)
        cached.chmod(0o644)
        cached.write_bytes(b"bit rot" + data[7:])
        assert cli(capsys, "models", "list", "--config", str(config))[0] == 0  # trusted by its name
        code, out, _ = cli(capsys, "models", "list", "--config", str(config), "--verify")
        assert code == 1 and "mismatch" in out
        code, out, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress", "--verify")
        assert code == 0, err
        assert "does not have its sha256; removed, fetching it again" in out
        assert files.sent["/a"] == 2 * len(data)
    assert cached.read_bytes() == data


def test_a_gated_file_gets_the_hosts_token_and_no_other_host_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from comfysup.models import sources

    data = content(1000, seed=17)
    monkeypatch.setattr(sources, "TOKENS", {"localhost": "HF_TOKEN"})  # the test's server stands for the hub
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FileServer({"/a": data}, token="hf_secret").serving() as files:
        port = files.url.rsplit(":", 1)[1]
        config = write_config(tmp_path, [entry(f"http://localhost:{port}/a", data)])
        code, _, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 1 and "HTTP 401" in err and "$HF_TOKEN" in err
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        other = write_config(tmp_path / "other", [entry(f"{files.url}/a", data)])  # 127.0.0.1: not the hub
        assert cli(capsys, "models", "pull", "--config", str(other), "--no-progress")[0] == 1
        code, _, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 0, err
        assert files.sent["/a"] == len(data)


def test_a_partial_file_that_is_already_whole_is_verified_without_a_byte(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A pull killed after the last byte but before the rename: the server answers 416 (nothing after that byte),
    and the partial file's hash decides."""
    data = content(5000, seed=18)
    with FileServer({"/a": data}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", data)])
        partial = tmp_path / "var" / "model-cache" / "partial" / hashlib.sha256(data).hexdigest()
        partial.parent.mkdir(parents=True)
        partial.write_bytes(data)
        code, _, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 0, err
        assert files.ranges == [f"bytes={len(data)}-"] and files.sent["/a"] == 0
    assert blob(tmp_path / "var" / "model-cache", data).read_bytes() == data and not partial.exists()


def test_a_file_larger_than_the_free_space_is_refused_before_its_bytes(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from comfysup.models import pull as pulling

    monkeypatch.setattr(pulling, "free_bytes", lambda folder: pulling.RESERVE_BYTES + 1000)  # the file has 5000
    data = content(5000, seed=19)
    with FileServer({"/a": data}).serving() as files:
        config = write_config(tmp_path, [entry(f"{files.url}/a", data)])
        code, _, err = cli(capsys, "models", "pull", "--config", str(config), "--no-progress")
        assert code == 1 and "the cache's disk" in err and "Make room" in err
        assert files.sent["/a"] <= 5000  # what the kernel took before the answer was read; none of it written
    assert (tmp_path / "var" / "model-cache" / "partial" / hashlib.sha256(data).hexdigest()).stat().st_size == 0
