"""The ``comfysup`` command: one subcommand per thing a person running ComfyUI in production does.

Each subcommand lives in comfysup/commands/<name>.py with ``register(subparsers)``; this module only
builds the parser, loads the config, and turns a ComfysupError into its message and exit code, so a
person sees what was wrong and what to do rather than a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from comfysup import __version__
from comfysup.errors import ComfysupError

COMMANDS = ("init", "submit", "status", "show", "manage", "work", "results", "run", "health", "systemd_unit",
            "demo")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="comfysup",
        description="Run ComfyUI in production: a durable queue of jobs, one supervised ComfyUI server "
                    "per GPU, each job done exactly once or dead-lettered with a reason.",
        epilog="Settings come from --config, $COMFYSUP_CONFIG, ./config.toml or /etc/comfysup/config.toml "
               "(the first that exists), then COMFYSUP_<SECTION>_<KEY> variables, then flags.")
    parser.add_argument("--version", action="version", version=f"comfysup {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", help="config file (default: ./config.toml, then "
                        "/etc/comfysup/config.toml)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"comfysup.commands.{name}")
        module.register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ComfysupError as exc:
        print(f"comfysup {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"comfysup {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
