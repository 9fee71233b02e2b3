"""`python -m fake_comfy` / `python fake_comfy/main.py`: ComfyUI's command line, plus the fake's knobs.

The supervisor launches the fake exactly as it launches ComfyUI, so every ComfyUI flag is accepted:
the ones that matter here are honoured, the others (--database-url, --preview-method, ...) are
ignored. Exit codes and signals behave like ComfyUI's: exit 1 when the port is taken, killed by
SIGTERM (-15) since there is no handler, killed by SIGKILL (-9) on a scripted "crash".
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from . import v038
from .hostile import CATALOGUE
from .models import FOLDERS, parse_models, read_extra_paths
from .options import MAXIMUM_HISTORY_SIZE, Options
from .script import WORDS, ScriptError, load_script_file, parse_words
from .server import CannotBind, FakeServer
from .version import __version__, default_version, normalize


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fake_comfy",
        description="A scriptable stand-in for ComfyUI 0.3.64 (no GPU, no models).",
        allow_abbrev=False,  # an unknown ComfyUI flag must never be taken for a prefix of ours
        epilog="script words: " + "; ".join(f"{w}: {what}" for w, what in WORDS.items()),
    )
    comfy = parser.add_argument_group("ComfyUI's flags")
    comfy.add_argument("--listen", type=str, default="127.0.0.1", metavar="IP", nargs="?", const="0.0.0.0,::")
    comfy.add_argument("--port", type=int, default=8188)
    comfy.add_argument("--cuda-device", type=str, default=None, metavar="DEVICE_ID")
    comfy.add_argument("--base-directory", type=str, default=None)
    comfy.add_argument("--output-directory", type=str, default=None)
    comfy.add_argument("--temp-directory", type=str, default=None)
    comfy.add_argument("--input-directory", type=str, default=None)
    comfy.add_argument("--cpu", action="store_true")
    comfy.add_argument(
        "--extra-model-paths-config", type=str, default=None, metavar="PATH", nargs="+", action="append"
    )
    comfy.add_argument("--database-url", type=str, default=None)
    comfy.add_argument("--disable-assets", action="store_true")
    comfy.add_argument("--cache-classic", action="store_true")
    fake = parser.add_argument_group("fake_comfy's knobs")
    fake.add_argument("--comfyui-version", default=None, metavar="0.3.64|0.38",
                      help="answer as this ComfyUI (default: $FAKE_COMFY_VERSION, else 0.38)")
    fake.add_argument("--fake-ram-pressure", action="store_true",
                      help="0.38: the RAM_PRESSURE cache keeps nothing (every prompt runs uncached)")
    fake.add_argument("--node-ms", type=float, default=5.0, help="time each executed node takes (default 5)")
    fake.add_argument(
        "--load-ms",
        type=float,
        default=50.0,
        help="extra time of a loader whose model differs from the one it loaded last (default 50)",
    )
    fake.add_argument(
        "--history-delay-ms",
        type=float,
        default=0.0,
        help="gap between execution_success and the history write (default 0)",
    )
    fake.add_argument(
        "--script",
        type=str,
        default="",
        metavar="WORD,WORD,...",
        help="one word per posted prompt, in order of arrival; then ok",
    )
    fake.add_argument(
        "--script-file",
        type=str,
        default=None,
        metavar="FILE",
        help="JSON object from prompt id to a list of words, one per time the id is posted",
    )
    fake.add_argument(
        "--busy",
        type=int,
        default=0,
        metavar="N",
        help="queue N prompts of another client that hang until interrupted or deleted",
    )
    fake.add_argument(
        "--exec-log",
        type=str,
        default=None,
        metavar="FILE",
        help="append one JSON line per server start, post, execution start and end (survives a kill)",
    )
    fake.add_argument(
        "--hostile-seed",
        type=int,
        default=None,
        metavar="N",
        help="give a random hostile mutation to a share of the prompts scripted ok (same seed, same choice)",
    )
    fake.add_argument("--hostile-rate", type=float, default=0.3, metavar="R", help="that share (default 0.3)")
    fake.add_argument(
        "--hostile-only",
        type=str,
        default="",
        metavar="NAME,...",
        help="the seed picks only among these mutations or places (e.g. history,ws:not-json)",
    )
    fake.add_argument(
        "--hostile-trickle-s", type=float, default=1.0, metavar="S", help="seconds per byte of a trickled body"
    )
    fake.add_argument(
        "--hostile-cap-s", type=float, default=60.0, metavar="S", help="a trickled or endless body ends after S"
    )
    fake.add_argument(
        "--hostile-list", action="store_true", help="print the hostile catalogue (name, place, what) and exit"
    )
    fake.add_argument("--without-nodes", default="", metavar="CLASS,CLASS",
                      help="node classes this server lacks: not in /object_info, refused at POST /prompt")
    fake.add_argument("--choices", action="append", default=[], metavar="CLASS.INPUT=a,b",
                      help="that combo input's choices (model files this server has), in /object_info and "
                           "validation; repeatable")
    fake.add_argument("--models", nargs="?", const="", default=None, metavar="FOLDER=FILE,FILE;FOLDER=...",
                      help="the model files this server has, listed by its loaders and checked at POST /prompt "
                           f"(folders: {', '.join(FOLDERS)}); alone: a default set; unset: loaders take any name")
    fake.add_argument("--step-ms", type=float, default=2.0, help="time of each sampler step (default 2)")
    fake.add_argument("--max-history", type=int, default=MAXIMUM_HISTORY_SIZE, help=argparse.SUPPRESS)
    parser.add_argument("--version", action="version", version=f"fake_comfy {__version__}")
    return parser


def parse_options(argv: Sequence[str]) -> Options:
    """Options from a ComfyUI-style command line (unknown flags ignored). Raises ScriptError."""
    parser = build_parser()
    args, _unknown = parser.parse_known_args(list(argv))
    version = normalize(args.comfyui_version) if args.comfyui_version else default_version()
    cuda_device = _cuda_device(parser, argv, version, args.cuda_device)
    extra_paths = [path for group in args.extra_model_paths_config or [] for path in group]
    script_file = _path(args.script_file)
    if script_file is not None:
        load_script_file(script_file)
    return Options(
        listen=args.listen,
        port=args.port,
        base_directory=_path(args.base_directory) or Path.cwd(),
        output_directory=_path(args.output_directory),
        temp_directory=_path(args.temp_directory),
        input_directory=_path(args.input_directory),
        cuda_device=cuda_device,
        comfyui_version=version,
        database_url=args.database_url,
        disable_assets=args.disable_assets,
        cache_classic=args.cache_classic,
        ram_pressure=args.fake_ram_pressure,
        cpu=args.cpu,
        extra_model_paths_config=extra_paths,
        model_folders=model_folders(extra_paths),
        node_ms=args.node_ms,
        load_ms=args.load_ms,
        history_delay_ms=args.history_delay_ms,
        script=parse_words(args.script),
        script_file=script_file,
        busy=args.busy,
        max_history=args.max_history,
        exec_log=Path(args.exec_log).absolute() if args.exec_log else None,
        hostile_seed=args.hostile_seed,
        without_nodes=_names(args.without_nodes),
        choices={k: [c for c in v.split(",") if c] for k, _, v in (c.partition("=") for c in args.choices)},
        models=None if args.models is None else parse_models(args.models),
        step_ms=args.step_ms,
        hostile_rate=args.hostile_rate,
        hostile_only=_names(args.hostile_only),
        hostile_trickle_s=args.hostile_trickle_s,
        hostile_cap_s=args.hostile_cap_s,
    )


def _path(text: str | None) -> Path | None:
    """A path flag's value; None when it is not given (or empty)."""
    return Path(text) if text else None


def _names(text: str) -> list[str]:
    """A comma-separated list of names, blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


def _cuda_device(parser: argparse.ArgumentParser, argv: Sequence[str], version: str,
                 given: str | None) -> int | str | None:
    """--cuda-device as the ComfyUI being faked reads it: 0.3.64's argparse takes an int (exit 2 otherwise), 0.38's
    a string; 0.38 refuses the flags it removed as unrecognized arguments (exit 2)."""
    if version == v038.NEW:
        removed = v038.removed_flag(list(argv))
        if removed:  # 0.38's argparse knows it no more: "unrecognized arguments", exit 2
            parser.error(f"unrecognized arguments: {removed}")
        return given
    if given is None:
        return None
    try:
        return int(given)
    except ValueError:
        parser.error(f"argument --cuda-device: invalid int value: {given!r}")


def model_folders(paths: Sequence[str]) -> dict[str, list[Path]]:
    """The folders the --extra-model-paths-config files add, merged. A file that does not exist is said and skipped
    (ComfyUI would stop at it; the fake is also started with made-up names, to show it accepts the flag); one that
    cannot be read as such a file stops the start (ValueError)."""
    folders: dict[str, list[Path]] = {}
    for path in paths:
        if not os.path.exists(path):
            print(f"fake_comfy: --extra-model-paths-config {path}: no such file; skipped", file=sys.stderr)
            continue
        try:
            found = read_extra_paths(path)
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"--extra-model-paths-config {path}: {exc}") from None
        for folder, directories in found.items():
            folders.setdefault(folder, []).extend(directories)
    return folders


def kill_self() -> None:
    """The "crash" word: die as a killed ComfyUI does (SIGKILL: no cleanup, no history, exit -9)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


async def serve(options: Options) -> None:
    """Start, announce the address as ComfyUI does, and serve until killed."""
    server = FakeServer(options, crash=kill_self)
    port = await server.start()
    package = Path(__file__).resolve().parent
    print(
        f"fake_comfy {__version__} (a ComfyUI {options.comfyui_version} stand-in) from {package}, base "
        f"{options.base_directory}"
    )
    print("Starting server\n")
    for host in options.listen.split(","):
        shown = f"[{host}]" if ":" in host else host
        print(f"To see the GUI go to: http://{shown}:{port}", flush=True)
    await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else list(argv)
    try:
        options = parse_options(arguments)
    except (ScriptError, OSError, ValueError) as exc:
        print(f"fake_comfy: {exc}", file=sys.stderr)
        return 2
    if "--hostile-list" in arguments:
        for mutation in CATALOGUE.values():
            print(f"{mutation.name}\t{mutation.where}\t{mutation.doc}")
        return 0
    options.argv = ["main.py", *arguments]
    try:
        asyncio.run(serve(options))
    except CannotBind as exc:
        if options.comfyui_version == v038.NEW:
            print(v038.port_in_use_message(options.port, options.listen.split(",")[0]), file=sys.stderr)
        else:
            print(f"fake_comfy: {exc}", file=sys.stderr)
        return 1
    except v038.AssetsInUse as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nStopped server")
    return 0
