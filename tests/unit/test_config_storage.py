"""[store] and [assets]'s object-storage keys: impossible values refused with the key, the value and
what is accepted; credentials from the environment; the bucket's path never shown in a message."""

from __future__ import annotations

from pathlib import Path

import pytest

from comfysup.config import load_config
from comfysup.errors import ConfigError


def error_of(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), env={})
    return str(info.value)


REFUSED = {
    '[store]\nurl = "https://bucket/x"': "[store] url = 'https://bucket/…': expected s3://bucket/prefix",
    '[assets]\nurl = "s3://bucket/a/../b"': "[assets] url = 's3://bucket/…': the prefix has an empty, . or .. part",
    '[store]\nurl = "s3://key:secret@bucket/x"': "with no credentials, query or fragment",
    '[store]\nendpoint_url = "127.0.0.1:8333"': "[store] endpoint_url = '127.0.0.1:8333': expected http(s)://host:port",
    "[store]\nurl_ttl_seconds = 700000": "[store] url_ttl_seconds = 700000: at most 604800",
    "[store]\nmultipart_threshold_mb = 4": "[store] multipart_threshold_mb = 4: at least 5",
}
"""Each text of a config file and what its refusal says."""


def test_impossible_storage_values_are_refused(tmp_path: Path) -> None:
    for text, words in REFUSED.items():
        message = error_of(tmp_path, text)
        assert words in message and str(tmp_path / "config.toml") in message, (text, message)
        assert "secret@" not in message and "a/../b" not in message


def test_credentials_come_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text('[store]\nurl = "s3://renders/prod"\nendpoint_url = "http://127.0.0.1:8333"\n')
    config = load_config(str(path), env={"COMFYSUP_STORE_ACCESS_KEY_ID": "AKIA123",
                                         "COMFYSUP_STORE_SECRET_ACCESS_KEY": "s3cr3t-value"})
    assert (config.store.access_key_id, config.store.secret_access_key) == ("AKIA123", "s3cr3t-value")
    assert config.store.url_ttl_seconds == 3600 and config.assets.url == ""
