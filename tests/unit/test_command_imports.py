"""`comfysup status` and `comfysup submit` import only the parts of comfysup, and the libraries, that their work
needs: neither reaches into the runner, the supervisor or the metrics, neither loads an HTTP client for a job
that fetches nothing, and neither imports dataclasses. How fast they start is measured by bench/startup.py, not here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from comfysup.queue.asset_ids import new_asset_id
from comfysup.slotstate import pid_exists

REPO = Path(__file__).resolve().parents[2]
RUN = ("import atexit, sys\n"
       "atexit.register(lambda: print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr))\n"
       "from comfysup.cli import main\n"
       "raise SystemExit(main(sys.argv[1:]))\n")
# An input from elsewhere (comfysup.jobs.fetch) is the one part of a submit that speaks HTTP (urllib3, requests).
# The records both define are comfysup.records' (no dataclasses, which generates code and imports inspect).
NOT_ON_EITHER = ("comfysup.jobs.fetch", "requests", "urllib3", "websocket", "prometheus_client", "comfysup.runner",
                 "dataclasses", "inspect")
NOT_FOR_STATUS = ("comfysup.jobs", *NOT_ON_EITHER)
# A line's id is read and derived without the uuid module, which loads platform (comfysup.jobs.identity).
NOT_FOR_SUBMIT = ("comfysup.supervisor", "uuid", "platform", *NOT_ON_EITHER)


def _modules(tmp_path: Path, *argv: str) -> set[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")} | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", RUN, *argv, "--config", str(tmp_path / "config.toml")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stderr.splitlines() if line.startswith("MODULES "))
    return set(line.split()[1:])


@pytest.mark.parametrize(("command", "absent"), [("submit", NOT_FOR_SUBMIT), ("status", NOT_FOR_STATUS)])
def test_a_command_imports_only_what_it_uses(tmp_path: Path, command: str, absent: tuple[str, ...]) -> None:
    (tmp_path / "config.toml").write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    workflow = {"1": {"class_type": "EmptyImage", "inputs": {}}, "2": {"class_type": "SaveImage",
                                                                   "inputs": {"images": ["1", 0]}}}
    (tmp_path / "jobs.jsonl").write_text(json.dumps({"id": str(uuid.uuid4()), "workflow": workflow}) + "\n")
    modules = _modules(tmp_path, "submit", "jobs.jsonl")  # status reads the queue this makes
    if command == "status":
        modules = _modules(tmp_path, "status")
    imported = sorted(m for m in modules if any(m == a or m.startswith(a + ".") for a in absent))
    assert not imported, f"comfysup {command} imported {imported}"


def test_pid_exists_tells_a_live_process_from_one_that_ended() -> None:
    assert pid_exists(os.getpid())
    assert pid_exists(1)  # init: alive, and not ours to signal unless we are root, which still says it exists
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert not pid_exists(ended.pid)
    assert not pid_exists(0) and not pid_exists(-1)


def test_the_derived_id_is_the_uuid5_of_the_line_in_comfysups_namespace() -> None:
    """Ids are derived without the uuid module (which loads platform) and stay what uuid.uuid5 makes them; an id
    written otherwise is read as uuid.UUID reads it."""
    from comfysup import jobs
    from comfysup.jobs.identity import derived_id, sorted_json, uuid5
    from comfysup.jobs.values import uuid_form

    namespace = uuid.UUID("7a1c0f3e-3b8e-5b6a-9d2e-63f0c0a5e1d4")
    assert namespace.bytes == jobs.ID_NAMESPACE
    line = {"workflow": "w.json", "set": {"seed": 1}, "priority": 3}
    expected = uuid.uuid5(namespace, sorted_json({"workflow": "blake3:ab", "set": {"seed": 1}, "priority": 3}))
    assert derived_id(line, {"seed": 1}, "blake3:ab") == str(expected)
    assert derived_id(line, {"seed": 2}, "blake3:ab") != str(expected)
    for name in ("", "a", "é 漢字 \U0001f600", "x" * 1000):
        assert uuid5(namespace.bytes, name) == str(uuid.uuid5(namespace, name))
    some = uuid.uuid4()
    for text in (str(some), str(some).upper(), some.hex, f"{{{some}}}", some.urn, f"urn:{some.hex}", "0" * 31 + "_",
                 "-" + "0" * 31, "+" + "0" * 31, "g" * 32, "not-a-uuid", "0" * 33):
        try:
            expected_form: str | None = str(uuid.UUID(text))
        except ValueError:
            expected_form = None
        assert uuid_form(text) == expected_form, text
    with pytest.raises(AttributeError):
        jobs.NO_SUCH_NAME  # noqa: B018


def test_the_program_freezes_what_its_imports_made_and_runs_the_command_with_the_collector_on(
        tmp_path: Path) -> None:
    """comfysup as a program: the collector is off while the command's modules are imported, what they made is
    frozen (gc.freeze), and it is on again while the command runs; a caller of main(argv) keeps its own gc."""
    (tmp_path / "config.toml").write_text(f'[queue]\npath = "{tmp_path / "q.db"}"\n')
    probe = ("import gc, sys\n"
             "import comfysup.commands.status as status\n"
             "real = status.run\n"
             "def run(args):\n"
             "    print('GC', gc.isenabled(), gc.get_freeze_count() > 0, file=sys.stderr)\n"
             "    return real(args)\n"
             "status.run = run\n"
             "import comfysup.cli as cli\n"
             "original = cli.build_parser\n"
             "def build_parser(*a, **k):\n"
             "    print('IMPORTING', gc.isenabled(), file=sys.stderr)\n"
             "    return original(*a, **k)\n"
             "cli.build_parser = build_parser\n"
             "how = sys.argv.pop(1)\n"
             "raise SystemExit(cli.main(None if how == 'program' else sys.argv[1:]))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMFYSUP_")} | {"PYTHONPATH": str(REPO)}
    seen = {}
    for how in ("program", "caller"):
        done = subprocess.run([sys.executable, "-c", probe, how, "status", "--config", str(tmp_path / "config.toml")],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert "no queue database here" in done.stderr  # status ran (it found no queue: none is needed here)
        seen[how] = [line for line in done.stderr.splitlines() if line.startswith(("GC", "IMPORTING"))]
    assert seen["program"] == ["IMPORTING False", "GC True True"]
    assert seen["caller"] == ["IMPORTING True", "GC True False"]


def test_a_runner_imports_no_http_library_it_does_not_use() -> None:
    """The runner's HTTP is the standard library's http.client (comfysup.comfy.transport): urllib3 (its multipart
    encoder, for jobs that upload a file) and requests are imported where they are used, so a runner whose jobs
    bring no file keeps neither in its memory."""
    code = ("import sys\nimport comfysup.runner.loop, comfysup.commands.work, comfysup.supervisor.supervisor\n"
            "print(' '.join(sorted(sys.modules)))\n")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    modules = set(done.stdout.split())
    assert not sorted(m for m in modules if m.split(".")[0] in ("urllib3", "requests"))


def test_an_asset_id_is_a_random_version_4_uuid_in_its_text_form() -> None:
    """The queue's asset ids are made without the uuid module (which loads platform at import): each one is what
    ``str(uuid.uuid4())`` would give, and no two are alike."""
    made = [new_asset_id() for _ in range(200)]
    for text in made:
        parsed = uuid.UUID(text)
        assert (str(parsed), parsed.version, parsed.variant) == (text, 4, uuid.RFC_4122)
    assert len(set(made)) == len(made)
