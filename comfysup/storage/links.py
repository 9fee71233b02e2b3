"""What every door hands out for an output in a bucket: its stable ``s3://`` location and, unless
``[store] url_ttl_seconds`` is 0, a presigned URL anyone can GET until ``url_expires_at``; so any machine, or a
client with no credentials, fetches any output straight from the bucket, with no machine-to-machine streaming.

A presigned URL is computed here (a signature over the key and the expiry: no call to the service), so
``show``, ``results --csv``, a webhook, a broker message or the API pays about a millisecond per file for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import urlsplit

from comfysup.storage import s3

log = logging.getLogger("comfysup.storage")


class LinkSettings(s3.Settings, Protocol):
    url_ttl_seconds: int


class Links:
    """``links(path)`` for an output recorded at ``path``: {} for a file on a machine's disk; for an object,
    ``location`` (s3://bucket/key) and, with a TTL, ``url`` and ``url_expires_at`` (epoch seconds)."""

    def __init__(self, settings: LinkSettings, wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.wall = wall
        self._warned = False

    def __call__(self, path: str, ttl_seconds: int | None = None) -> dict[str, Any]:
        """``ttl_seconds`` overrides [store] url_ttl_seconds (the API's redirect needs a URL even when it is 0)."""
        if s3.split_uri(path) is None:
            return {}
        out: dict[str, Any] = {"location": path}
        ttl = self.settings.url_ttl_seconds if ttl_seconds is None else ttl_seconds
        if ttl <= 0:
            return out
        try:
            out["url"] = s3.presign(s3.client(self.settings), path, ttl)
        except Exception as exc:  # no credentials to sign with here: the location alone is still the truth
            if not self._warned:
                self._warned = True
                log.warning("cannot presign URLs for outputs in the bucket, only their s3:// locations are "
                            "shown: %s", s3.redactor(self.settings)(str(exc), 300))
            return out
        out["url_expires_at"] = self.wall() + min(ttl, s3.MAX_TTL_SECONDS)
        return out


def origin(settings: LinkSettings, bucket_url: str) -> str:
    """``scheme://host[:port]`` the presigned URLs of ``bucket_url``'s objects point to ("" without a bucket or a
    way to sign): what a page that shows them as images must allow (its Content-Security-Policy)."""
    if not bucket_url or settings.url_ttl_seconds <= 0:
        return ""
    location = s3.parse(bucket_url)
    url = Links(settings)(location.uri(location.key("x"))).get("url", "")
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def no_links(path: str, ttl_seconds: int | None = None) -> dict[str, Any]:
    """For a caller with no [store] at hand: nothing beyond what the record says."""
    return {}
