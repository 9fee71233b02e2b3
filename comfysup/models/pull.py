"""``comfysup models pull`` and the pull ``comfysup run`` makes before it starts servers: every file of the manifest
into the cache, verified, then linked by name where the servers look.

For each content not yet in the cache: take its fetch lock, continue its partial file from the source, hash every
byte on the way, and rename it into ``sha256/<hex>`` only when the hash is the manifest's. A download that breaks
off is continued where it stopped (after a short wait, while each try brings bytes); a wrong hash is an error
naming the file, and the bytes that had it are removed (the next pull starts over, never reusing them). A file
whose content is already cached (this machine or another on the same cache fetched it) costs nothing.
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from comfysup.config import Config, ModelFile
from comfysup.config.models import shown_url
from comfysup.errors import ComfysupError
from comfysup.models.cache import Cache, Partial, cache_dir, file_sha256, link_view
from comfysup.models.sources import FetchError, Transient, fetch

log = logging.getLogger(__name__)

TRIES_WITHOUT_PROGRESS = 4
"""Tries in a row that bring no byte before a pull gives up on a file (waiting 1, 2, 4 s between them)."""
MAX_TRIES = 100
"""Tries of one file in all, even while each brings bytes (a source that always breaks off must end too)."""
RESERVE_BYTES = 1 << 30
"""Left free on the cache's disk: a pull never fills it (the queue or the servers may share it)."""
DISK_CHECK_BYTES = 64 << 20
"""How often, in bytes received, the free space is looked at again."""


class ModelsError(ComfysupError):
    """Some model files of the manifest could not be pulled."""


@dataclass
class PullReport:
    present: int = 0
    """Files already in the cache."""
    fetched: int = 0
    fetched_bytes: int = 0
    """Bytes received by this pull (a continued download counts only what it added)."""
    seconds: float = 0.0
    failed: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = (f"models: {self.present} already cached, {self.fetched} fetched "
                f"({human_bytes(self.fetched_bytes)}) in {self.seconds:.1f} s")
        return text + (f"; {len(self.failed)} failed" if self.failed else "")


def pull(config: Config, *, say: Callable[[str], None] = print, bar: bool = True,
         verify: bool = False) -> PullReport:
    """Pull every file of ``config.models`` into the cache and link the verified ones where the servers look.

    ``verify`` hashes files already cached again (a removed bad one is fetched anew). Raises ModelsError naming
    each file that failed, after trying all of them."""
    started = time.monotonic()
    cache = Cache(cache_dir(config))
    report = PullReport()
    done: set[str] = set()
    for entry in config.models:
        if entry.sha256 in done:  # the same content under two names: one file in the cache
            report.present += 1
            continue
        try:
            received = None if _cached(cache, entry, verify, say) else _pull_one(cache, entry, say, bar)
            if received is None:
                report.present += 1
            else:
                report.fetched_bytes += received
                report.fetched += 1
            done.add(entry.sha256)
        except (FetchError, ModelsError) as exc:
            report.failed.append(f"{entry.folder}/{entry.name} ({entry.where}): {exc}")
        except OSError as exc:
            report.failed.append(f"{entry.folder}/{entry.name} ({entry.where}): cache {cache.root}: "
                                 f"{exc.strerror or exc}")
    link_view(config, cache)
    report.seconds = time.monotonic() - started
    if report.failed:
        raise ModelsError("could not pull:\n  " + "\n  ".join(report.failed))
    return report


def _cached(cache: Cache, entry: ModelFile, verify: bool, say: Callable[[str], None]) -> bool:
    blob = cache.blob(entry.sha256)
    if not blob.is_file():
        return False
    if verify and file_sha256(blob) != entry.sha256:
        say(f"models: {entry.folder}/{entry.name}: the cached file {blob} does not have its sha256; removed, "
            "fetching it again")
        blob.unlink()
        return False
    return True


def _pull_one(cache: Cache, entry: ModelFile, say: Callable[[str], None], bar: bool) -> int | None:
    """Fetch one content under its lock: the bytes received, or None when another process fetched it meanwhile."""
    label = f"{entry.folder}/{entry.name}"
    with cache.locked(entry.sha256, lambda: say(f"models: {label}: another pull is fetching it; waiting")):
        if cache.blob(entry.sha256).is_file():
            return None
        part = Partial(cache.partial(entry.sha256))
        start = part.size
        try:
            say(f"models: {label}: fetching from {shown_url(entry.url)}"
                + (f" (continuing after {human_bytes(start)})" if start else ""))
            received = _fetch_with_retries(entry, part, label, bar, say)
            digest = part.hash.hexdigest()
            if digest != entry.sha256:
                part.discard()
                raise ModelsError(f"the file from {shown_url(entry.url)} has sha256 {digest}, the manifest says "
                                  f"{entry.sha256}; it was removed. Check the url and the sha256 (sha256sum FILE)")
            part.finish(cache.blob(entry.sha256))
        except BaseException:
            part.close()
            raise
        say(f"models: {label}: verified, {human_bytes(cache.blob(entry.sha256).stat().st_size)}")
        return received


def _fetch_with_retries(entry: ModelFile, part: Partial, label: str, show_bar: bool,
                        say: Callable[[str], None]) -> int:
    received = 0
    with tqdm(total=None, initial=part.size, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
              file=sys.stderr, dynamic_ncols=True, disable=None if show_bar else True) as progress:
        checked = 0

        def on_bytes(n: int) -> None:
            nonlocal received, checked
            received += n
            progress.update(n)
            if received - checked >= DISK_CHECK_BYTES:  # a source that sends more than it said, or no length
                checked = received
                _room(part, 0, label)

        def on_total(total: int | None) -> None:
            progress.total = total
            progress.n = part.size
            progress.refresh()
            _room(part, (total or 0) - part.size, label)

        without_progress = 0
        for tries in range(1, MAX_TRIES + 1):
            before = part.size
            try:
                fetch(entry.url, part, on_bytes, on_total)
                return received
            except Transient as exc:
                without_progress = 0 if part.size > before else without_progress + 1
                if without_progress >= TRIES_WITHOUT_PROGRESS or tries == MAX_TRIES:
                    raise FetchError(f"{exc} (tried {tries} times; run the pull again to continue from "
                                     f"{human_bytes(part.size)})") from None
                delay = 0 if without_progress == 0 else 2 ** (without_progress - 1)  # it was moving: at once
                say(f"models: {label}: {exc}; continuing" + (f" in {delay} s" if delay else ""))
                time.sleep(delay)
    raise AssertionError("unreachable")


def _room(part: Partial, needed: int, label: str) -> None:
    """Refuse to fill the cache's disk: the bytes still to come (when the source said the size) and
    ``RESERVE_BYTES`` must fit. The partial file stays, to be continued once there is room."""
    free = free_bytes(part.path.parent)
    if needed + RESERVE_BYTES > free:
        raise FetchError(f"{label}: the cache's disk ({part.path.parent.parent}) has {human_bytes(free)} free; "
                         f"{human_bytes(max(needed, 0))} more are needed and {human_bytes(RESERVE_BYTES)} are kept "
                         "free. Make room (or set [comfyui] models_cache elsewhere) and pull again: it continues")


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
