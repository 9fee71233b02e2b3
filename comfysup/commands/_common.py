"""What every command needs: the config from --config plus flags, and the queue."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import Any

from comfysup.config import Config, load_config
from comfysup.config.loader import find_config_file, has_env_settings, no_config_found
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
