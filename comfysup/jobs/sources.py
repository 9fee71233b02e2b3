"""Where an input from elsewhere comes from, as comfysup.jobs.inputs checks it before anything is fetched and
comfysup.jobs.fetch reads it: the source as messages show it, an s3 source's bucket and key, and the error of
a fetch.
"""

from __future__ import annotations

from comfysup.redact import display_url


class FetchError(Exception):
    """An input could not be fetched; the message is the reason a person reads (no URL path or query in it:
    a presigned URL's query is its secret)."""


def where(source: str) -> str:
    """The source as messages show it: ``s3://bucket/key`` (its own name, no secret), a URL as scheme://host/…"""
    return source if source.startswith("s3://") else display_url(source)


def s3_parts(source: str) -> tuple[str, str]:
    """``(bucket, key)`` of ``s3://bucket/key``; FetchError when either is missing."""
    bucket, _, key = source.removeprefix("s3://").partition("/")
    if not source.startswith("s3://") or not bucket or not key:
        raise FetchError(f"{source[:200]!r} is not s3://bucket/key")
    return bucket, key
