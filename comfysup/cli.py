"""The ``comfysup`` command: one subcommand per thing a person running ComfyUI in production does.

Each subcommand lives in comfysup/commands/<name>.py with ``register(subparsers)``; this module only
builds the parser, loads the config, and turns a ComfysupError into its message and exit code, so a
person sees what was wrong and what to do rather than a traceback.

Only the module of the command being run is imported: importing every command (requests, the
supervisor) took half a second of each ``comfysup status``. ``--help``, an unknown command or a module
that does not register the name asked for falls back to all of them, so usage and errors list everything.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence

from comfysup import __version__
from comfysup.errors import ComfysupError

MODULE_OF = {"retry": "manage", "cancel": "manage", "systemd-unit": "systemd_unit"}
"""Commands whose module is not named after them."""
COMMANDS = ("init", "submit", "status", "show", "manage", "work", "results", "run", "health", "systemd_unit",
            "demo", "migrate", "prune", "api", "consume", "models", "workflow")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(modules: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    parser = _Parser(
        prog="comfysup",
        description="Run ComfyUI in production: a durable queue of jobs, one supervised ComfyUI server "
                    "per GPU, each job done exactly once or dead-lettered with a reason.",
        epilog="Settings come from --config, $COMFYSUP_CONFIG, ./config.toml, ~/.config/comfysup/config.toml "
               "($XDG_CONFIG_HOME) or /etc/comfysup/config.toml (the first that exists), then "
               "COMFYSUP_<SECTION>_<KEY> variables, then flags. `comfysup init` writes one.")
    parser.add_argument("--version", action="version", version=f"comfysup {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="PATH", help="config file (default: the first of ./config.toml, "
                        "~/.config/comfysup/config.toml and /etc/comfysup/config.toml)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in modules:
        module = importlib.import_module(f"comfysup.commands.{name}")
        module.register(sub, common)
    return parser


def _parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """A parser with only the asked command's module when that module registers it, else all of them."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command is not None and not any(a in ("-h", "--help", "--version") for a in argv[:argv.index(command)]):
        module = MODULE_OF.get(command, command.replace("-", "_"))
        if module in COMMANDS:
            parser = build_parser((module,))
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            if command in sub.choices:
                return parser
    return build_parser()


def main(argv: Sequence[str] | None = None) -> int:
    program = argv is None  # the comfysup process itself, not a caller (a test) in its own process
    argv = list(sys.argv[1:] if argv is None else argv)
    enabled = gc.isenabled()
    if program:
        # What the command's imports make lives as long as the process (modules, classes, functions): the cycle
        # collector's ~15 passes over it found nearly nothing, 1.7 ms of each submit and status. Off while they
        # run, then those objects frozen out of its reach (as the supervisor does before it forks) and the
        # collector back on before the command runs: the long-running ones (run, work, api) need it.
        gc.disable()
    try:
        parser = _parser_for(argv)
    finally:
        if program:
            gc.freeze()
            if enabled:
                gc.enable()
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
