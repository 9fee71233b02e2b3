"""What every command needs: the config from --config plus flags, and the queue."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from typing import Any

from comfysup.config import Config, load_config
from comfysup.config.loader import find_config_file, has_env_settings, no_config_found
from comfysup.errors import UsageError
from comfysup.queue import Queue, open_queue


def config_from(args: argparse.Namespace, overrides: Mapping[str, Any] | None = None, *,
                required: bool = True) -> Config:
    """The settings for a command. With no config file anywhere it looks (``config_paths``), no COMFYSUP_* setting
    and no ``--queue``, a command that works on the queue says so and what to run, rather than make a new, empty
    queue in the current folder that no supervisor reads."""
    explicit = getattr(args, "config", None)
    queue_path = getattr(args, "queue", None)
    if queue_path:
        overrides = {**(overrides or {}), "queue.path": queue_path}
    if (required and not explicit and not queue_path and find_config_file(None) is None
            and not has_env_settings(os.environ)):
        raise no_config_found(f"comfysup {getattr(args, 'command', None) or 'this command'}")
    return load_config(explicit, overrides=overrides)


def queue_from(config: Config, *, create: bool = False) -> Queue:
    return open_queue(config, create=create)


MIN_PREFIX = 4
"""The shortest id prefix taken (as git's): fewer characters name too many jobs to be meant."""


def resolve_ids(queue: Queue, given: Sequence[str]) -> list[str]:
    """Each id as typed, or the one job id it begins (any unique prefix of at least MIN_PREFIX characters, as git
    takes a commit's); UsageError names one that matches nothing or several."""
    from comfysup.jobs.values import JobLineError, canonical_id  # here: comfysup.jobs is most of submit's imports

    out = []
    for typed in given:
        text = typed.strip().lower()
        try:
            out.append(canonical_id(text))
            continue
        except JobLineError:
            pass
        if len(text) < MIN_PREFIX or text.strip("0123456789abcdef-"):
            raise UsageError(f"{typed!r} is not a job id: give the whole id, or at least its first {MIN_PREFIX} "
                             "characters (hex digits and hyphens)")
        found = queue.reads.ids_starting(text, limit=4)
        if not found:
            raise UsageError(f"no job id begins with {typed!r}")
        if len(found) > 1:
            more = "" if len(found) < 4 else ", …"
            raise UsageError(f"{typed!r} begins several job ids ({', '.join(found[:3])}{more}); give more characters")
        out.append(found[0])
    return out

