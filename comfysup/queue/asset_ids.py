"""The id the queue gives an asset (an API upload, a job's output): a random (version 4) UUID as text.

Made from ``os.urandom`` as ``uuid.uuid4`` makes it, without the uuid module, which loads ``platform`` at import
in every command that opens a queue though only a runner's ``done`` and an API upload make one.
"""

from __future__ import annotations

import os


def new_asset_id() -> str:
    """A fresh random UUID (RFC 4122 version 4, variant 1) in its 36-character text form, as ``str(uuid.uuid4())``."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40  # version 4
    raw[8] = (raw[8] & 0x3F) | 0x80  # variant RFC 4122
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
