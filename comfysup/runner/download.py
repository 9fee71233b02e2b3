"""Step 5 of an attempt (docs/design.md): each output of a finished run into the result store, under a temporary
name then renamed, from the server's output folder where comfysup can see it, else through /view.

Plain functions of the attempt's :class:`Context`, the run and its history entry; ``checkpoint`` is the
attempt's wake-up (its heartbeat, cancel, deadline and stop checks), called before each file: given True, it
renews the lease at once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from comfysup.comfy import ComfyError, PermanentError
from comfysup.comfy.history import output_files
from comfysup.queue.base import Output
from comfysup.runner import outputs as job_outputs
from comfysup.runner.running import Context, Run
from comfysup.runner.store import Incomplete, TooLarge, UnsafeName, is_disk_full, safe_relative
from comfysup.storage import s3

log = logging.getLogger("comfysup.runner")


def download(ctx: Context, run: Run, entry: dict[str, Any], checkpoint: Callable[[bool], None]) -> list[Output]:
    """The run's files, stored and checked; the list of what was stored, for the done."""
    try:
        named = sources(ctx, run, entry)
    except (UnsafeName, TypeError) as exc:
        raise PermanentError(str(exc), "unsafe_output") from exc
    twice = next((r for r, n in Counter(relative for relative, _, _ in named).items() if n > 1), None)
    if twice is not None:  # the second would replace the first, whose recorded hash would then be a lie
        raise PermanentError(f"the server names two outputs that are both stored as {twice!r}", "unsafe_output")
    ctx.trace.phase("downloading", ctx.wall())
    # Only the attempt that holds the job may clear its folder: a fenced heartbeat now stops a stale
    # one (LeaseLost) before it touches files that the job's new owner may be writing. While the queue does
    # not answer, the lease still held by this machine's clock stands for it (comfysup.runner.hold).
    checkpoint(True)
    try:
        ctx.station.store.prepare(ctx.claim.id)
    except UnsafeName as exc:  # its folder is a symlink: nothing of it is touched, the job is dead
        raise PermanentError(str(exc), "unsafe_output") from exc
    except OSError as exc:  # the job's folder cannot be made: as transient as a file that cannot be written
        raise _store_failure(exc, ctx.claim.id) from exc
    outputs: list[Output] = []
    for relative, chunks, node in named:
        checkpoint(False)
        left = ctx.s.max_job_bytes - sum(o.size for o in outputs)
        try:
            stored = ctx.station.store.write(ctx.claim.id, relative, chunks(), limit_bytes=left,
                                             limit_name="what is left of [store] max_job_mb",
                                             progress=lambda: checkpoint(False))
            outputs.append(stored._replace(node_id=node))  # the node that made it: the API's get_outputs(node)
        except UnsafeName as exc:
            raise PermanentError(str(exc), "unsafe_output") from exc
        except TooLarge as exc:
            raise PermanentError(str(exc), "too_large") from exc
        except Incomplete as exc:
            raise ComfyError(str(exc), "download") from exc
        except OSError as exc:  # the store, or (adopted from disk) the server's folder since the scan
            raise _store_failure(exc, relative) from exc
    ctx.station.store.finish(ctx.claim.id)
    return outputs

def sources(ctx: Context, run: Run, entry: dict[str, Any]) -> list[tuple[str, Callable[[], Iterable[bytes]], str]]:
    """Each file's name in the store and where its bytes come from. Stored under the names the user chose:
    without the job's own folder that comfysup added to the prefixes.

    From the job's folder in the server's output folder when comfysup can see it (a server of this
    machine: ``comfysup run``'s own, a [[servers]] entry with an output_dir): a run adopted from disk, and
    every file the history names there, read from the disk rather than asked of the server. A /view is a
    round trip to a server that is running the next prompt by then (queued ahead), and ComfyUI answers
    it only when its executing thread lets go of the GIL: on a real ComfyUI it was 30% of a runner's wall
    time on trivial prompts. Anything else (a temp file, a file outside the job's folder, a server
    elsewhere, a file not found where it should be) comes through /view."""
    folder = ctx.station.output_dir(run.server, run.client)
    if run.from_disk is not None:
        return [(safe_relative(f.filename, f.subfolder),
                 partial(job_outputs.read, folder, ctx.claim.id, f.relative), f.node) for f in run.from_disk]
    out: list[tuple[str, Callable[[], Iterable[bytes]], str]] = []
    for f in output_files(entry):
        subfolder = f.get("subfolder") or ""
        relative = safe_relative(f["filename"], job_outputs.store_name(subfolder, ctx.claim.id))
        view = partial(run.client.view, f["filename"], subfolder, f["type"])
        within = job_outputs.in_job_folder(subfolder, ctx.claim.id) if f["type"] == "output" else None
        out.append((relative, view if folder is None or within is None else
                    partial(job_outputs.read_or, folder, ctx.claim.id, relative, view), f.get("node", "")))
    return out


def _store_failure(exc: OSError, where: str) -> ComfyError:
    """A transient failure of the result store (a full disk is freed, a mount comes back): retried, then
    dead with this reason. Never an exception out of the attempt: that crashes the runner, and a job
    whose every attempt crashes its runner would never end while it takes down one runner after another."""
    what = "the result store's disk is full" if is_disk_full(exc) else "cannot write to the result store"
    if isinstance(exc, s3.Unreachable):  # its message names the object and what the service said
        return ComfyError(f"cannot store the output in the bucket: {exc.strerror}", "store")
    return ComfyError(f"{what}: {exc.strerror} ({where})", "store")


def remove_job_folders(ctx: Context) -> None:
    """The job's folder in every output folder this runner can see, once its end is recorded: saves list
    the folder to count, so it must not keep growing (best-effort)."""
    for server in ctx.s.output_dirs:
        job_outputs.discard(ctx.s.output_dirs, server, ctx.claim.id)
