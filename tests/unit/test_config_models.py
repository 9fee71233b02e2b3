"""The model manifest in the config: ``[[models]]`` and a models.toml are read into one list, and every mistake is
an error naming the file, the entry, the key and what to write (nothing is fetched before the whole list is sound).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.config import load_config
from comfysup.errors import ConfigError

SHA = "ab" * 32
GOOD = f'folder = "checkpoints"\nname = "a.safetensors"\nurl = "https://hf.example/a"\nsha256 = "{SHA}"\n'


def load(tmp_path: Path, text: str) -> object:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return load_config(str(path), env={})


def error(tmp_path: Path, text: str) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    return str(info.value)


def test_entries_of_the_file_and_of_the_manifest_it_names(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "models.toml").write_text(
        f'[[models]]\nfolder = "loras"\nname = "sub/x.safetensors"\nurl = "files/x.safetensors"\n'
        f'sha256 = "{SHA.upper()}"\n')
    config = load(tmp_path, f'[comfyui]\nmodels_manifest = "m/models.toml"\n\n[[models]]\n{GOOD}')
    first, second = config.models  # type: ignore[attr-defined]
    assert (first.folder, first.name, first.url) == ("checkpoints", "a.safetensors", "https://hf.example/a")
    assert first.where == f"{tmp_path / 'config.toml'}: [[models]] #1"
    assert second.url == str(tmp_path / "m" / "files" / "x.safetensors")  # relative to the file it is written in
    assert second.sha256 == SHA  # lower case
    assert second.where == f"{tmp_path / 'm' / 'models.toml'}: [[models]] #1"


@pytest.mark.parametrize(("change", "expected"), [
    ('folder = "checkpoint"', "folder = 'checkpoint': not a ComfyUI model folder; did you mean 'checkpoints'?"),
    ('folder = "custom_nodes"', "not a ComfyUI model folder"),
    ('name = "../../etc/passwd"', "has an empty, hidden, . or .. part"),
    ('name = "/abs.safetensors"', "not a relative file name"),
    ('name = "a\\\\b.safetensors"', "backslash"),
    ('url = "ftp://host/a"', "the scheme 'ftp' cannot be fetched"),
    ('url = "s3://bucket"', "expected s3://BUCKET/KEY"),
    ('sha256 = "abc"', "sha256 = 'abc': expected 64 hex digits"),
    ('sha256 = 5', "sha256 = 5: expected a non-empty string"),
    ('size = 5', "unknown key 'size'; known keys: folder, name, url, sha256"),
])
def test_a_bad_entry_names_where_and_what(tmp_path: Path, change: str, expected: str) -> None:
    key = change.split(" = ")[0]
    body = "\n".join(line for line in GOOD.splitlines() if not line.startswith(key + " ")) + "\n" + change + "\n"
    message = error(tmp_path, f"[[models]]\n{body}\n[[models]]\n{GOOD.replace('a.safetensors', 'b.safetensors')}")
    assert f"{tmp_path / 'config.toml'}: [[models]] #1: " in message
    assert expected in message


def test_a_url_with_credentials_is_never_shown(tmp_path: Path) -> None:
    message = error(tmp_path, f"[[models]]\n{GOOD.replace('https://hf.example/a', 'gopher://u:secret@h/a?t=tok')}")
    assert "secret" not in message and "tok" not in message


def test_one_file_named_twice_is_refused(tmp_path: Path) -> None:
    message = error(tmp_path, f"[[models]]\n{GOOD}\n[[models]]\n{GOOD}")
    assert "[[models]] #2: checkpoints/a.safetensors is already named by" in message
    legacy = GOOD.replace('"checkpoints"', '"clip"')
    message = error(tmp_path, f"[[models]]\n{legacy}\n[[models]]\n{legacy.replace('clip', 'text_encoders')}")
    assert "already named" in message  # clip is ComfyUI's old name of text_encoders: one folder


def test_a_file_named_as_the_folder_of_another_is_refused(tmp_path: Path) -> None:
    """checkpoints/a and checkpoints/a/b cannot both be: the link of one would be the folder of the other (the
    pull that made the view failed with a FileExistsError traceback)."""
    inner = GOOD.replace('"a.safetensors"', '"a.safetensors/b.safetensors"')
    for first, second in ((GOOD, inner), (inner, GOOD)):
        message = error(tmp_path, f"[[models]]\n{first}\n[[models]]\n{second}")
        assert "[[models]] #" in message and "checkpoints/a.safetensors is a file and a folder" in message, message


def test_a_manifest_that_is_missing_or_holds_settings_is_refused(tmp_path: Path) -> None:
    message = error(tmp_path, '[comfyui]\nmodels_manifest = "models.toml"\n')
    assert "models_manifest = 'models.toml': no such file" in message
    (tmp_path / "models.toml").write_text("[runner]\nattempts = 2\n")
    message = error(tmp_path, '[comfyui]\nmodels_manifest = "models.toml"\n')
    assert "models.toml: unknown key or section 'runner'; a models manifest holds only [[models]]" in message


def test_models_is_an_array_of_tables(tmp_path: Path) -> None:
    assert "models must be an array of tables" in error(tmp_path, '[models]\nfolder = "checkpoints"\n')
