"""At the edges a user controls: numbers, nesting, paths, URLs and standard input at submit, and
secrets that a cut text could leak. Each case fails without its fix (see the issue's list)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_support import cli, count_jobs, job_id, line, run_cli, write_config, write_jobs
from hypothesis import given, settings
from hypothesis import strategies as st

from comfysup.jobs import MAX_DEPTH
from comfysup.redact import FRAGMENT_CHARS, MASK, Redactor, bound, mask, secret_values

pytestmark = pytest.mark.timeout(60)


def nested(levels: int, leaf: object = "x") -> object:
    """``levels`` lists inside each other, built without recursion."""
    value: object = leaf
    for _ in range(levels):
        value = [value]
    return value


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)


def submit(capsys: pytest.CaptureFixture[str], tmp_path: Path, lines: list[str]) -> tuple[int, str, str]:
    config = write_config(tmp_path)
    write_jobs(tmp_path, lines)
    return cli(capsys, "submit", "--config", str(config), "jobs.jsonl")


@pytest.mark.parametrize(("raw", "message"), [
    (line(1).replace('"1.color": 1', '"1.color": 1e999'), "1e999 is too large for a number"),
    (line(1).replace('"1.color": 1', '"1.color": -1e999'), "-1e999 is too large for a number"),
    (line(1, workflow="wf\u0000.json"), "contains a NUL byte"),
    (line(1, workflow="wf\ud800.json"), "contains a lone surrogate (\\ud800)"),
    (line(1, callback_url="http://example.com/\u0000hook"), "callback_url 'http://example.com/\\x00hook' "
                                                            "contains a NUL byte"),
    (line(1, callback_url="http://example.com/\udc80"), "contains a lone surrogate (\\udc80)"),
    (line(1, meta={"deep": nested(MAX_DEPTH)}), f"nested more than {MAX_DEPTH} levels deep"),
    (line(1, extra_data={"deep": nested(MAX_DEPTH)}), f"nested more than {MAX_DEPTH} levels deep"),
])
def test_bad_values_are_refused_with_their_line(capsys: pytest.CaptureFixture[str], tmp_path: Path, raw: str,
                                                message: str) -> None:
    code, _, err = submit(capsys, tmp_path, [raw])
    assert code == 2, err
    assert "jobs.jsonl:1: " in err and message in err, err
    assert "Traceback" not in err
    assert count_jobs(tmp_path) == 0


def test_nesting_at_the_limit_is_accepted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The line itself is one level, meta another: MAX_DEPTH - 2 lists inside them reach the limit exactly.
    code, out, err = submit(capsys, tmp_path, [line(1, meta={"deep": nested(MAX_DEPTH - 2)})])
    assert code == 0, err
    assert "submitted 1 job(s)" in out


def test_a_line_nested_600_deep_is_refused_not_stored(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    raw = json.dumps({"id": job_id(1), "workflow": "wf.json", "meta": nested(600)})
    code, _, err = submit(capsys, tmp_path, [raw])
    assert code == 2 and "jobs.jsonl:1: the line is nested more than 64 levels deep" in err, err


def test_a_workflow_file_nested_too_deep(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write_config(tmp_path)
    workflow = {"1": {"class_type": "SaveImage", "inputs": {"images": nested(MAX_DEPTH + 1),
                                                            "filename_prefix": "x"}}}
    write_jobs(tmp_path, [line(1)], workflow=workflow)
    code, _, err = cli(capsys, "submit", "--config", str(config), "jobs.jsonl")
    assert code == 2 and "workflow file" in err and "nested more than 64 levels" in err, err


def test_closed_standard_input_is_a_clear_error(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    import subprocess
    import sys

    from cli_support import REPO
    proc = subprocess.run([sys.executable, "-m", "comfysup", "submit", "--config", str(config), "-"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=False,
                          # close fd 0 in the child: what `comfysup submit - <&-` does
                          preexec_fn=lambda: __import__("os").close(0))
    assert proc.returncode == 2, proc.stderr
    assert "standard input is closed" in proc.stderr and "Traceback" not in proc.stderr


def test_standard_input_still_works(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    write_jobs(tmp_path, [])
    proc = run_cli("submit", "--config", str(config), "-", cwd=tmp_path, stdin=line(1) + "\n")
    assert proc.returncode == 0 and "submitted 1 job(s)" in proc.stdout, proc.stderr


# ---- secrets ---------------------------------------------------------------------------------------------

SECRET = "comfyui-AbCdEfGh1234567890-ZyXwVuT"


def fragments(text: str, secret: str) -> list[str]:
    return [secret[i:i + FRAGMENT_CHARS] for i in range(len(secret) - FRAGMENT_CHARS + 1)
            if secret[i:i + FRAGMENT_CHARS] in text]


def test_a_body_cut_before_redaction_leaves_no_fragment() -> None:
    # What a 5xx answer cut at 300 characters by the client looked like: the key's first half at the end.
    body = ("x" * 260 + f'"api_key_comfy_org": "{SECRET}"')[:300]
    redact = Redactor.for_job({}, {"api_key_comfy_org": SECRET})
    out = redact(f"POST /prompt: 500: {body}")
    assert fragments(out, SECRET) == []
    assert MASK in out


@settings(max_examples=200, deadline=None)
@given(secret=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=8, max_size=60),
       before=st.text(max_size=40), after=st.text(max_size=40), start=st.integers(0, 80), size=st.integers(0, 140),
       limit=st.integers(10, 200))
def test_no_cut_anywhere_leaves_a_fragment(secret: str, before: str, after: str, start: int, size: int,
                                           limit: int) -> None:
    """Any window of a text that held the secret, redacted then bounded, holds no run of 8 of its characters
    — unless that run was in the text around it anyway (then it is not the secret's doing)."""
    text = (before + secret + after)[start:start + size]
    out = Redactor([secret])(text, limit)
    assert fragments(out, secret) == [] or fragments(before + after, secret)
    assert len(out) <= limit + len(" … (999999 more characters)")


def test_bound_cuts_after_redaction() -> None:
    redact = Redactor([SECRET])
    out = redact("a" * 10 + SECRET + "b" * 10, limit=12)
    assert out.startswith("a" * 10 + "**") and fragments(out, SECRET) == []
    assert bound("abc", 2) == "ab … (1 more characters)"


def test_masking_and_collecting_survive_any_depth() -> None:
    deep = nested(200_000, {"api_key_comfy_org": SECRET})
    extra = {"wrapper": deep}
    assert secret_values({}, extra) == {SECRET}
    masked = mask(extra)
    inner = masked["wrapper"]
    for _ in range(200_000):
        inner = inner[0]
    assert inner == {"api_key_comfy_org": MASK}


def test_mask_keeps_links_and_plain_values() -> None:
    value = {"images": ["2", 0], "token": ["a", "b"], "n": 3, "password": None, "auth": True}
    assert mask(value) == {"images": ["2", 0], "token": [MASK, MASK], "n": 3, "password": None, "auth": True}


# ---- webhooks to private destinations (item 7) --------------------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9/hook", "http://localhost/hook", "http://[::1]/hook", "http://10.1.2.3/hook",
    "http://192.168.0.7/hook", "http://172.16.5.5/hook", "http://169.254.169.254/latest/meta-data",
    "http://[fe80::1]/hook", "http://metadata.google.internal/computeMetadata/v1/", "http://0.0.0.0/hook",
    "http://[::ffff:127.0.0.1]/hook", "https://user:pass@hooks.example/hook",
])
def test_private_callbacks_are_refused_at_submit(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                 url: str) -> None:
    code, _, err = submit(capsys, tmp_path, [line(1, callback_url=url)])
    assert code == 2 and "jobs.jsonl:1: callback_url" in err and "allow_private = true" in err, err
    assert "/hook" not in err.split("callback_url", 1)[1].split(":", 3)[-1] or "…" in err  # no path shown
    assert count_jobs(tmp_path) == 0


def test_private_callbacks_pass_when_allowed(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = write_config(tmp_path)
    config.write_text(config.read_text() + "[webhooks]\nallow_private = true\n")
    write_jobs(tmp_path, [line(1, callback_url="http://127.0.0.1:9/hook")])
    code, out, err = cli(capsys, "submit", "--config", str(config), "jobs.jsonl")
    assert code == 0 and "submitted 1 job(s)" in out, err


def test_a_public_callback_is_accepted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = submit(capsys, tmp_path, [line(1, callback_url="https://hooks.example.com/x")])
    assert code == 0, err


def test_a_private_webhooks_url_in_the_config_is_refused(tmp_path: Path) -> None:
    from comfysup.config import load_config
    from comfysup.errors import ConfigError

    config = write_config(tmp_path)
    config.write_text(config.read_text() + '[webhooks]\nurl = "http://169.254.169.254/secret-path"\n')
    with pytest.raises(ConfigError, match=r"169\.254\.169\.254 is a link-local address; set \[webhooks\] "
                                          r"allow_private") as info:
        load_config(str(config), env={})
    assert "secret-path" not in str(info.value)


def test_the_connected_address_is_checked_not_only_the_name() -> None:
    """2130706433 is no IP literal to a URL check (so a name, to be resolved), yet it connects to 127.0.0.1:
    what a rebinding name does. The session refuses it on the connected socket, before sending a byte."""
    from webhook_support import Receiver

    from comfysup.destinations import url_problem
    from comfysup.safehttp import PrivateDestination, public_only_session

    receiver = Receiver(fail_first=0).start()
    try:
        port = receiver.url.rsplit(":", 1)[1]
        url = f"http://2130706433:{port}/hook"
        assert url_problem(url) is None
        with pytest.raises(PrivateDestination, match=r"127\.0\.0\.1 is a loopback address"):
            public_only_session().post(url, data=b"{}", timeout=5)
        assert receiver.got == []  # nothing reached it
        import requests
        assert requests.post(url, data=b"{}", timeout=5).status_code == 204  # the plain session does reach it
    finally:
        receiver.stop()


def test_a_refused_delivery_says_why(tmp_path: Path) -> None:
    from queue_contract import make_job
    from webhook_support import Receiver

    from comfysup.config import WebhooksConfig
    from comfysup.observability.webhooks import Deliverer
    from comfysup.queue.sqlite import SQLiteQueue

    receiver = Receiver(fail_first=0).start()  # it listens: the refusal is the check's, not the network's
    queue = SQLiteQueue(tmp_path / "q.db", create=True)
    try:
        job = make_job(1, callback_url=f"http://2130706433:{receiver.url.rsplit(':', 1)[1]}/hook")
        queue.intake.submit([job])
        queue.intake.cancel([job.id])  # a terminal state: its delivery is due
        deliverer = Deliverer(queue, WebhooksConfig(attempts=1))
        deliverer.run_once()
        [delivery] = queue.deliveries.deliveries(job.id)
        assert delivery.state == "failed" and "127.0.0.1 is a loopback address" in (delivery.last_error or "")
        assert receiver.got == []
    finally:
        queue.close()
        receiver.stop()


# ---- the status page and metrics server (item 8) ----------------------------------------------------------

def test_workflow_labels_past_the_bound_fold_into_other() -> None:
    from prometheus_client import CollectorRegistry

    from comfysup.observability.metrics import OTHER, Observer

    observer = Observer(CollectorRegistry(), since=0.0, max_workflow_labels=3)
    names = [f"kind-{i}" for i in range(1000)]
    got = [observer.workflow_label(n) for n in names]
    assert got[:3] == names[:3] and set(got[3:]) == {OTHER}
    assert observer.workflow_label("kind-1") == "kind-1"  # one already in use keeps its label
    assert len(observer.workflows) == 3


def test_the_label_bound_is_configurable_and_checked(tmp_path: Path) -> None:
    from comfysup.config import load_config
    from comfysup.errors import ConfigError

    config = write_config(tmp_path)
    config.write_text(config.read_text() + "[metrics]\nmax_workflow_labels = 0\n")
    with pytest.raises(ConfigError, match="max_workflow_labels = 0: must be at least 1"):
        load_config(str(config), env={})


def test_a_job_folder_that_is_a_symlink_is_never_written_through(tmp_path: Path) -> None:
    from comfysup.runner.store import ResultStore, UnsafeFolder

    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "passwd").write_text("root:x:0:0")
    store = ResultStore(tmp_path / "store", max_file_bytes=2**20)
    store.root.mkdir()
    job = job_id(1)
    (store.root / job).symlink_to(outside)
    with pytest.raises(UnsafeFolder, match="is a symlink"):
        store.prepare(job)
    with pytest.raises(UnsafeFolder, match="is a symlink"):
        store.write(job, "out.png", [b"png"])
    assert sorted(p.name for p in outside.iterdir()) == ["passwd"]
    assert (outside / "passwd").read_text() == "root:x:0:0"


def test_a_subfolder_that_turns_into_a_symlink_is_refused(tmp_path: Path) -> None:
    from comfysup.runner.store import ResultStore, UnsafeFolder

    outside = tmp_path / "outside"
    outside.mkdir()
    store = ResultStore(tmp_path / "store", max_file_bytes=2**20)
    job = job_id(2)
    store.prepare(job)
    (store.root / job / "sub").symlink_to(outside)
    with pytest.raises(UnsafeFolder):
        store.write(job, "sub/out.png", [b"png"])
    assert list(outside.iterdir()) == []
    store.prepare(job)  # the leftover link is removed as a link, its target untouched
    assert list((store.root / job).iterdir()) == [] and outside.is_dir()


@pytest.mark.parametrize("name", ["a\nb.png", "a\rb.png", "a\x1bb.png", "a\x00b.png"])
def test_output_names_with_control_characters_are_unsafe(name: str) -> None:
    from comfysup.runner.store import UnsafeName, safe_relative

    with pytest.raises(UnsafeName):
        safe_relative(name, "")
    with pytest.raises(UnsafeName):
        safe_relative("ok.png", name)


@pytest.fixture
def big_file_server(tmp_path: Path):  # type: ignore[no-untyped-def]
    """The status endpoint in this process, serving one job's 256 MiB output (a sparse file: no disk)."""
    import threading

    from comfysup.observability.metrics import Metrics
    from comfysup.observability.web import App, serve
    from comfysup.queue.sqlite import SQLiteQueue

    job = job_id(9)
    folder = tmp_path / "store" / job
    folder.mkdir(parents=True)
    with open(folder / "big.bin", "wb") as f:
        f.truncate(256 * 2**20)
    queue = SQLiteQueue(tmp_path / "q.db", create=True)
    server = serve("127.0.0.1:0", App(queue, Metrics(queue, lambda: None), lambda: None, tmp_path / "store"))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/files/{job}/big.bin"
    server.shutdown()
    server.server_close()
    queue.close()


@pytest.mark.timeout(120)
def test_large_files_stream_with_bounded_memory(big_file_server: str) -> None:
    import threading

    import psutil
    import requests

    me = psutil.Process()
    before = me.memory_info().rss
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], me.memory_info().rss)

    def fetch(sizes: list[int]) -> None:
        with requests.get(big_file_server, stream=True, timeout=60) as answer:
            sizes.append(sum(len(c) for c in answer.iter_content(2**20)))

    sampler = threading.Thread(target=sample)
    sampler.start()
    sizes: list[int] = []
    clients = [threading.Thread(target=fetch, args=(sizes,)) for _ in range(3)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    done.set()
    sampler.join()
    assert sizes == [256 * 2**20] * 3
    assert peak[0] - before < 100 * 2**20, f"RSS grew by {(peak[0] - before) / 2**20:.0f} MiB"


def test_a_client_that_goes_away_leaves_no_traceback(big_file_server: str, capfd: pytest.CaptureFixture[str],
                                                     caplog: pytest.LogCaptureFixture) -> None:
    import logging
    import socket
    import urllib.parse

    caplog.set_level(logging.DEBUG, logger="comfysup.observability.web")
    url = urllib.parse.urlsplit(big_file_server)
    for _ in range(3):
        with socket.create_connection((url.hostname, url.port), timeout=10) as s:
            s.sendall(f"GET {url.path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert s.recv(1024).startswith(b"HTTP/1.0 200")
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    import requests
    assert requests.get(big_file_server.replace("big.bin", "missing"), timeout=10).status_code == 404  # serving on
    deadline = time.monotonic() + 10
    while not any("went away" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.02)
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Traceback" not in out, err


def test_log_lines_escape_control_characters(capfd: pytest.CaptureFixture[str]) -> None:
    import logging

    from comfysup.logs import setup_logging

    setup_logging(fmt="plain")
    logging.getLogger("comfysup.test").warning("output %s saved", "a.png\r\n2026-01-01 job 1 done\x1b[2J")
    err = capfd.readouterr().err
    assert "output a.png\\r\\n2026-01-01 job 1 done\\x1b[2J saved\n" in err
    assert err.count("\n") == 1


def test_base_directories_made_by_comfysup_are_private(tmp_path: Path) -> None:
    import stat

    from comfysup.config import build_config
    from comfysup.gpus import Slot
    from comfysup.supervisor import server

    config = build_config({"comfyui": {"main": "main.py", "base_directory": str(tmp_path / "var" / "comfyui")}},
                          source="<test>", root=str(tmp_path))
    plan = server.plan(config, Slot(index=0, name="cpu0", device=None))
    server.prepare(plan)
    for folder in (tmp_path / "var", tmp_path / "var" / "comfyui", plan.directory, plan.directory / "custom_nodes"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
