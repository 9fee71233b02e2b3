"""config.toml: a typo or an impossible value is an error naming the file, key, value and expectation.

And ``comfysup init`` writes a file that loads back, with a comment above every key.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from cli_support import cli

from comfysup.config import GpuSpec, load_config, parse_gpus
from comfysup.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [n for n in os.environ if n.startswith("COMFYSUP_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def error_of(path: Path, env: dict[str, str] | None = None, overrides: dict | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env=env or {}, overrides=overrides)
    return str(info.value)


def test_defaults_without_a_file(tmp_path: Path) -> None:
    config = load_config(None, env={})
    assert config.source == "<defaults>"
    assert config.runner.attempts == 4
    assert config.queue.path == "var/queue.db"
    assert config.resolve(config.queue.path) == tmp_path / "var" / "queue.db"


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    path = write(tmp_path / "etc", '[queue]\npath = "data/q.db"\n')
    config = load_config(str(path), env={})
    assert config.resolve(config.queue.path) == (tmp_path / "etc" / "data" / "q.db")


def test_unknown_key_names_the_file_the_key_and_what_is_known(tmp_path: Path) -> None:
    path = write(tmp_path, "[runner]\nattemps = 3\n")
    message = error_of(path)
    assert str(path) in message
    assert "unknown key 'attemps' in [runner]" in message
    assert "known keys: attempts," in message


def test_unknown_section(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "[runers]\nattempts = 3\n"))
    assert str(tmp_path / "config.toml") in message
    assert "unknown section [runers]" in message


@pytest.mark.parametrize(("text", "expected"), [
    ('[runner]\nattempts = "3"\n', "[runner] attempts = '3': expected a whole number"),
    ("[runner]\nattempts = 3.5\n", "[runner] attempts = 3.5: expected a whole number"),
    ("[runner]\nlease_seconds = true\n", "[runner] lease_seconds = True: expected a number"),
    ('[runner]\njitter = "no"\n', "[runner] jitter = 'no': expected true or false"),
    ("[queue]\npath = 5\n", "[queue] path = 5: expected a string"),
    ('[comfyui]\nextra_args = "--highvram"\n', "[comfyui] extra_args = '--highvram': expected a list of strings"),
    ("[comfyui]\ngpus = 3\n", "[comfyui] gpus = 3: expected a string or a list of whole numbers"),
])
def test_wrong_type_names_file_key_value_and_expected_type(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    message = error_of(path)
    assert message.startswith(f"{path}: ")
    assert expected in message


@pytest.mark.parametrize(("text", "expected"), [
    ("[runner]\nheartbeat_seconds = 60\nlease_seconds = 60\n",
     "[runner] heartbeat_seconds = 60.0: must be shorter than [runner] lease_seconds (60)"),
    ("[runner]\nheartbeat_seconds = 90\n", "[runner] heartbeat_seconds = 90.0: must be shorter than"),
    ("[comfyui]\nbase_port = 70000\n", "[comfyui] base_port = 70000: expected a TCP port between 1 and 65535"),
    ("[comfyui]\nbase_port = 0\n", "[comfyui] base_port = 0: expected a TCP port between 1 and 65535"),
    ("[runner]\nattempts = 0\n", "[runner] attempts = 0: must be at least 1"),
    ("[runner]\ntimeout_seconds = -1\n", "[runner] timeout_seconds = -1.0: must be greater than 0"),
    ('[queue]\nurl = "mysql://x"\n', "[queue] url = 'mysql://x': expected a postgresql://"),
    ('[metrics]\nlisten = "9188"\n', "[metrics] listen = '9188': expected HOST:PORT"),
    ('[webhooks]\nurl = "ftp://x"\n', "[webhooks] url = 'ftp://x': expected an http:// or https:// URL"),
    ('[webhooks]\nattempts = 0\n', "[webhooks] attempts = 0: must be at least 1"),
    ('[api]\npath_roots = [""]\n', "[api] path_roots: an empty entry would open the config file's whole folder"),
])
def test_impossible_values_name_file_key_value_and_what_would_do(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    message = error_of(path)
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_not_toml_names_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[runner\nattempts = 3\n")
    assert error_of(path).startswith(f"{path}: not valid TOML")


def test_a_missing_config_file_given_explicitly(tmp_path: Path) -> None:
    message = error_of(tmp_path / "nope.toml")
    assert "nope.toml: no such config file" in message


def test_precedence_defaults_file_environment_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "[runner]\nattempts = 3\nlease_seconds = 90\n[queue]\npath = \"file.db\"\n")
    assert load_config(str(path), env={}).runner.attempts == 3
    env = {"COMFYSUP_RUNNER_ATTEMPTS": "5", "COMFYSUP_QUEUE_PATH": "/srv/env.db"}
    config = load_config(str(path), env=env)
    assert (config.runner.attempts, config.queue.path, config.runner.lease_seconds) == (5, "/srv/env.db", 90.0)
    config = load_config(str(path), env=env, overrides={"runner.attempts": 7, "queue.path": None})
    assert (config.runner.attempts, config.queue.path) == (7, "/srv/env.db")  # None: flag not given


def test_environment_values_are_typed(tmp_path: Path) -> None:
    env = {"COMFYSUP_COMFYUI_GPUS": "[0, 2]", "COMFYSUP_RUNNER_JITTER": "false",
           "COMFYSUP_RUNNER_LEASE_SECONDS": "120", "COMFYSUP_COMFYUI_EXTRA_ARGS": '["--highvram"]'}
    config = load_config(None, env=env)
    assert config.comfyui.gpus == (0, 2)
    assert config.runner.jitter is False
    assert config.runner.lease_seconds == 120.0
    assert config.comfyui.extra_args == ("--highvram",)


def test_a_wrongly_typed_environment_value_names_the_variable(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, ""), env={"COMFYSUP_RUNNER_ATTEMPTS": "many"})
    assert "$COMFYSUP_RUNNER_ATTEMPTS: [runner] attempts = 'many': expected a whole number" in message


@pytest.mark.parametrize("name", ["COMFYSUP_RUNER_ATTEMPTS", "COMFYSUP_RUNNER_ATTEMPT", "COMFYSUP_PORT"])
def test_an_unknown_comfysup_variable_is_an_error(tmp_path: Path, name: str) -> None:
    message = error_of(write(tmp_path, ""), env={name: "3"})
    assert f"${name}" in message
    assert "unknown" in message


def test_unknown_variable_through_the_command(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COMFYSUP_RUNNER_ATEMPTS", "3")
    code, _, err = cli(capsys, "status", "--config", str(write(tmp_path, "")))
    assert code == 2
    assert "$COMFYSUP_RUNNER_ATEMPTS: unknown" in err


@pytest.mark.parametrize("listen", ["0.0.0.0", "192.168.1.20", "::"])
def test_a_non_loopback_listen_address_is_refused(tmp_path: Path, listen: str) -> None:
    path = write(tmp_path, f'[comfyui]\nlisten = "{listen}"\n')
    message = error_of(path)
    assert f"[comfyui] listen = '{listen}': not a loopback address" in message
    assert "private_network = true" in message
    config = load_config(str(write(tmp_path, f'[comfyui]\nlisten = "{listen}"\nprivate_network = true\n')),
                         env={})
    assert config.comfyui.listen == listen


@pytest.mark.parametrize("listen", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_listen_addresses_are_fine(tmp_path: Path, listen: str) -> None:
    assert load_config(str(write(tmp_path, f'[comfyui]\nlisten = "{listen}"\n')), env={}).comfyui.listen == listen


def test_the_status_endpoint_stays_on_loopback_too(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, '[metrics]\nlisten = "0.0.0.0:9188"\n'))
    assert "[metrics] listen = '0.0.0.0': not a loopback address" in message
    allowed = write(tmp_path, '[comfyui]\nprivate_network = true\n[metrics]\nlisten = "0.0.0.0:9188"\n')
    assert load_config(str(allowed), env={}).metrics.listen == "0.0.0.0:9188"
    assert load_config(str(write(tmp_path, '[metrics]\nlisten = ""\n')), env={}).metrics.listen == ""


def test_a_listen_address_that_is_not_an_ip(tmp_path: Path) -> None:
    assert "[comfyui] listen = 'comfy.local': expected an IP address" in \
        error_of(write(tmp_path, '[comfyui]\nlisten = "comfy.local"\n'))


@pytest.mark.parametrize(("value", "spec"), [
    ("auto", GpuSpec("auto")),
    ((0, 2), GpuSpec("list", indices=(0, 2))),
    ("cpu:2", GpuSpec("cpu", cpu_slots=2)),
])
def test_gpus_parsing(value: object, spec: GpuSpec) -> None:
    assert parse_gpus(value) == spec  # type: ignore[arg-type]


@pytest.mark.parametrize(("toml", "expected"), [
    ('"cpu:0"', "expected \"auto\", a list of CUDA indices like [0, 2], or \"cpu:N\""),
    ('"gpu0"', "expected \"auto\", a list of CUDA indices"),
    ("[]", "the list is empty"),
    ("[1, 1]", "expected distinct CUDA device indices"),
    ("[-1]", "expected distinct CUDA device indices (0 or more)"),
])
def test_bad_gpus_values(tmp_path: Path, toml: str, expected: str) -> None:
    path = write(tmp_path, f"[comfyui]\ngpus = {toml}\n")
    message = error_of(path)
    assert message.startswith(f"{path}: [comfyui] gpus = ")
    assert expected in message


def test_servers_are_checked(tmp_path: Path) -> None:
    ok = write(tmp_path, '[[servers]]\nname = "remote0"\nurl = "http://10.0.0.5:8188/"\n')
    assert [(s.name, s.url) for s in load_config(str(ok), env={}).servers] == [("remote0", "http://10.0.0.5:8188")]
    bad = write(tmp_path, '[[servers]]\nname = "r"\nurl = "10.0.0.5:8188"\n')
    assert "[[servers]] #1: url = '10.0.0.5:8188': expected http://HOST:PORT" in error_of(bad)
    twice = write(tmp_path, '[[servers]]\nname = "r"\nurl = "http://a:1"\n[[servers]]\nname = "r"\nurl = "http://b:1"\n')
    assert "name = 'r' appears twice" in error_of(twice)


def test_a_servers_output_dir_is_resolved_and_used_only_for_its_own_url(tmp_path: Path) -> None:
    from comfysup.commands.work import own_output_dirs

    path = write(tmp_path, '[[servers]]\nname = "local"\nurl = "http://127.0.0.1:8188"\noutput_dir = "ComfyUI/output"\n'
                           '[[servers]]\nname = "remote"\nurl = "http://10.0.0.5:8188"\n')
    config = load_config(str(path), env={})
    assert config.server_output_dirs() == {"local": path.parent / "ComfyUI" / "output"}  # beside the config
    assert own_output_dirs(config, {"local": "http://127.0.0.1:8188", "remote": "http://10.0.0.5:8188"}) == {
        "local": path.parent / "ComfyUI" / "output"}
    # `comfysup work --server local=URL` naming another server: the folder is not that server's.
    assert own_output_dirs(config, {"local": "http://127.0.0.1:9999"}) == {}
    bad = write(tmp_path, '[[servers]]\nname = "r"\nurl = "http://a:1"\noutput_dir = 3\n')
    assert "[[servers]] #1: output_dir = 3: expected the path of the server's output folder" in error_of(bad)
    unknown = write(tmp_path, '[[servers]]\nname = "r"\nurl = "http://a:1"\noutput = "x"\n')
    assert "unknown key 'output'; known keys: name, url, output_dir" in error_of(unknown)


def test_init_writes_a_commented_config_that_loads_back(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "conf" / "config.toml"
    target.parent.mkdir()
    code, out, _ = cli(capsys, "init", "-o", str(target), "--cpu", "2")
    assert code == 0
    assert f"wrote {target}" in out
    config = load_config(str(target), env={})
    assert config.comfyui.gpus == "cpu:2"
    assert parse_gpus(config.comfyui.gpus) == GpuSpec("cpu", cpu_slots=2)
    lines = target.read_text().splitlines()
    keys = [i for i, text in enumerate(lines) if re.match(r"^[a-z_]+ = ", text)]
    assert len(keys) > 30
    for i in keys:
        assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 10, f"no comment above {lines[i]!r}"
    for section in ("queue", "store", "comfyui", "runner", "supervisor"):
        assert f"[{section}]" in lines


def test_init_does_not_overwrite_without_force(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "config.toml"
    target.write_text("# mine\n")
    code, _, err = cli(capsys, "init", "-o", str(target), "--cpu", "1")
    assert code == 2
    assert "exists; use --force" in err
    assert target.read_text() == "# mine\n"
    code, _, _ = cli(capsys, "init", "-o", str(target), "--cpu", "1", "--force")
    assert code == 0
    assert load_config(str(target), env={}).comfyui.gpus == "cpu:1"


def test_init_refuses_zero_cpu_servers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = cli(capsys, "init", "-o", str(tmp_path / "c.toml"), "--cpu", "0")
    assert code == 2
    assert "--cpu N needs N of 1 or more" in err


@pytest.mark.parametrize("url", ["http://10.0.0.7:9189", "https://gpu7.example", "https://gpu7.example/",
                                 "http://[fd00::7]:9189", "http://127.0.0.1:9300"])
def test_api_public_url_takes_an_http_url_without_a_path(tmp_path: Path, url: str) -> None:
    config = load_config(str(write(tmp_path, f'[api]\npublic_url = "{url}"\n')), env={})
    assert config.api.public_url == url


def test_api_public_url_is_empty_by_default(tmp_path: Path) -> None:
    assert load_config(None, env={}).api.public_url == ""


@pytest.mark.parametrize(("url", "expected"), [
    ("ftp://gpu7.example", "expected the URL at which the other machines reach this API"),
    ("gpu7.example:9189", "expected the URL at which the other machines reach this API"),
    ("http://gpu7.example/api/v2", "no path, query or credentials; /api/v2 is added"),
    ("http://gpu7.example/?x=1", "no path, query or credentials"),
    ("http://", "expected the URL at which the other machines reach this API"),
    ("http://gpu7.example:0", "the port must be a number from 1 to 65535"),
    ("http://gpu7.example:70000", "the port must be a number from 1 to 65535"),
])
def test_a_bad_api_public_url_is_refused_with_what_to_write(tmp_path: Path, url: str, expected: str) -> None:
    message = error_of(write(tmp_path, f'[api]\npublic_url = "{url}"\n'))
    assert f"[api] public_url = {url!r}" in message and expected in message
    assert str(tmp_path / "config.toml") in message


def test_a_public_url_with_credentials_is_refused_without_showing_them(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, '[api]\npublic_url = "http://user:s3cret-pw@gpu7.example"\n'))
    assert "no path, query or credentials" in message and "gpu7.example" in message
    assert "s3cret-pw" not in message


def test_no_number_of_the_config_may_be_negative_even_without_a_rule_of_its_own() -> None:
    """The last check of every config: a key whose own rule was forgotten is still never negative."""
    from comfysup.config.checks import no_negative_numbers
    from comfysup.config.schema import Config
    from comfysup.records import replace

    config = Config()
    no_negative_numbers(config)
    broken = replace(config, api=replace(config.api, max_queued=-1), source="c.toml")
    with pytest.raises(ConfigError, match=r"c\.toml: \[api\] max_queued = -1: must be 0 or more"):
        no_negative_numbers(broken)


def test_every_rule_of_a_section_names_one_of_its_keys() -> None:
    """A section's RULES (keys that must agree with other keys) report on a key of that section."""
    from comfysup.config import SECTIONS
    from comfysup.records import fields

    for name, cls in SECTIONS.items():
        keys = {f.name for f in fields(cls)}
        for rule in getattr(cls, "RULES", ()):
            assert rule.key in keys, f"[{name}] rule {rule.check.__name__} names no key {rule.key!r}"


def test_a_sections_rules_are_not_a_key_of_the_file(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, "[runner]\nRULES = []\n"))
    assert "unknown key 'RULES' in [runner]; known keys: attempts," in message
    assert "RULES" not in message.partition("known keys:")[2]


def test_tenants_are_read_by_name_with_their_checks() -> None:
    import tomllib

    from comfysup.config.loader import build_config

    digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
    c = build_config(tomllib.loads(f'[tenants.studio-a]\nweight = 3\nmax_running = 2\ntoken_sha256 = "{digest}"\n'
                                   '[tenants.b]\nmax_queued = 10\n'), source="c.toml")
    assert [(t.name, t.weight, t.max_running, t.max_queued) for t in c.tenants] == [("b", 1.0, 0, 10),
                                                                                  ("studio-a", 3, 2, 0)]
    for text, says in (("[tenants.a]\nweight = 0", "[tenants.a] weight = 0: must be greater than 0"),
                       ("[tenants.a]\nwieght = 1", "unknown key 'wieght'"),
                       ('[tenants."a b"]\nweight = 1', "a tenant's name is"),
                       ('[tenants.a]\ntoken_sha256 = "secret"', "must be 64 hex digits"),
                       (f'[tenants.a]\ntoken_sha256 = "{digest}"\n[tenants.b]\ntoken_sha256 = "{digest}"',
                        "another tenant has the same token")):
        with pytest.raises(ConfigError, match=re.escape(says)):
            build_config(tomllib.loads(text), source="c.toml")
