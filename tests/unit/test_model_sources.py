"""comfysup.models.sources on answers a server should not send."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from comfysup.models.cache import Partial
from comfysup.models.sources import _receive


class Answer:
    """A 200 whose Content-Length is latin-1's superscript two: str.isdigit() says a digit, int() refuses it."""

    def __init__(self) -> None:
        self.status = 200
        self.headers = {"Content-Length": "\xb2"}

    def stream(self, size: int, decode_content: bool = False) -> Iterator[bytes]:
        yield b"ab"


def test_an_unreadable_content_length_is_no_length_not_a_traceback(tmp_path: Path) -> None:
    part = Partial(tmp_path / "partial" / ("0" * 64))
    totals: list[int | None] = []
    try:
        _receive(Answer(), "https://models.example/…", part, lambda _n: None, totals.append)
    finally:
        part.close()
    assert totals == [None] and part.size == 2
