"""``comfysup models pull | list``: the model manifest on this machine (comfysup.models).

``pull`` fetches every ``[[models]]`` file the cache lacks (continuing partial downloads), checks each hash, and
links the verified files where the servers comfysup launches look (``comfysup run`` does the same before it
starts them). ``list`` shows each file of the manifest: its folder and name, size, hash and state; it exits 1
when any file is not verified and linked where the servers look, so a script (or a container's start) can ask
whether this machine is ready.
"""

from __future__ import annotations

import argparse
import json

from comfysup.commands._common import config_from
from comfysup.config.models import shown_url
from comfysup.models.cache import Cache, cache_dir, state_of, view_dir
from comfysup.models.pull import human_bytes, pull


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("models", parents=[common], help="pull and list the model files of the manifest",
                       description="The model manifest ([[models]] in config.toml, or the file [comfyui] "
                                   "models_manifest names): each file's ComfyUI folder, name, url and sha256. Files "
                                   "are kept once per content in [comfyui] models_cache (default: model-cache "
                                   "beside the queue file; it may be shared by machines) and every server comfysup "
                                   "launches sees them through its own extra_model_paths.yaml.")
    # --config before or after the action: the action's own has no default, which would overwrite one given before.
    after = argparse.ArgumentParser(add_help=False)
    after.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help="config file (as before the action)")
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    pl = actions.add_parser("pull", parents=[after], help="fetch what the cache lacks and verify it",
                            description="Fetch each file of the manifest that the cache lacks (https:// and "
                                        "http:// continued with Range after an interruption, s3:// through boto3, "
                                        "local paths copied), check its sha256 before any server may use it, and "
                                        "link it by name where the servers look. Files already cached cost "
                                        "nothing. Exit 1 naming each file that failed (a wrong hash removes what "
                                        "was fetched).")
    pl.add_argument("--verify", action="store_true",
                    help="hash the files already cached too (reads them all) and fetch again any that changed")
    pl.add_argument("--no-progress", action="store_true", help="no progress bar (one line per file instead)")
    pl.set_defaults(func=run_pull)
    ls = actions.add_parser("list", parents=[after], help="each file: folder/name, size, sha256 and state",
                            description="Each file of the manifest with its size, sha256 and state: verified (in "
                                        "the cache, checked), partial (a download to continue), missing, or "
                                        "mismatch (--verify found other content); and whether the servers see it "
                                        "(linked). Exit 1 when any is not verified and linked.")
    ls.add_argument("--verify", action="store_true", help="hash each cached file again instead of trusting it")
    ls.add_argument("--json", action="store_true", help="one JSON object per file")
    ls.set_defaults(func=run_list)


def run_pull(args: argparse.Namespace) -> int:
    config = config_from(args)
    if not config.models:
        print(f"models: the manifest is empty (no [[models]] in {config.source}, no [comfyui] models_manifest)")
        return 0
    report = pull(config, say=lambda line: print(line, flush=True), bar=not args.no_progress, verify=args.verify)
    print(f"{report.summary()}; cache {cache_dir(config)}, servers see {view_dir(config)}")
    return 0


def run_list(args: argparse.Namespace) -> int:
    config = config_from(args)
    cache = Cache(cache_dir(config))
    states = [state_of(config, cache, entry, verify=args.verify) for entry in config.models]
    if args.json:
        for s in states:
            print(json.dumps({"folder": s.entry.folder, "name": s.entry.name, "size": s.size,
                              "sha256": s.entry.sha256, "state": s.state, "linked": s.linked,
                              "url": shown_url(s.entry.url)}))
    else:
        rows = [("FILE", "SIZE", "SHA256", "STATE")]
        rows += [(f"{s.entry.folder}/{s.entry.name}", human_bytes(s.size), s.entry.sha256[:16] + "…",
                  s.state + (" (fetched so far)" if s.state == "partial" else "")
                  + (", not linked: comfysup models pull links it" if s.state == "verified" and not s.linked else ""))
                 for s in states]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for row in rows:
            print("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:3])) + "  " + row[3])
        print(f"cache: {cache.root}")
    return 0 if all(s.state == "verified" and s.linked for s in states) else 1
