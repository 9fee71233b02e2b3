"""bench/real_report.py: bench/real.py's verification of each batch and its tables."""

from __future__ import annotations

import itertools
import re
import statistics
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import requests

SUBMIT_CPU = "submit CPU s"
"""A comfysup batch's note: the CPU of its ``comfysup submit`` command, which the tool's CPU includes; without
it, the CPU of the runner (``comfysup work``) alone: the goal of 1.5x the bare client's whole job."""


def prefix_of(prompt: dict[str, Any]) -> str:
    return next(n["inputs"]["filename_prefix"] for n in prompt.values() if n["class_type"] == "SaveImage")


def is_png(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


def executed(base: Path) -> int:
    """How many prompts the server has executed: ComfyUI logs "Prompt executed in" once for each."""
    try:
        return (base / "comfyui.log").read_text(errors="replace").count("Prompt executed in")
    except OSError:
        return 0


def verify(url: str, base: Path, batch: list, m: Any, posted: int) -> dict[str, Any]:
    """Each prompt of the batch: one history entry, a success, a PNG on the client's side; no prompt ran twice:
    the server executed exactly ``posted`` prompts so far (its log), and no prompt left two files in its output
    folder (comfysup with an output_dir removes each job's folder there once its files are stored; a prompt
    comfysup posts is named by its job id, so a second run would replace the first's history entry).
    ComfyUI's own execution times from its history."""
    want = {prefix_of(p) for p in batch}
    entries: dict[str, list] = defaultdict(list)
    for entry in requests.get(f"{url}/history", timeout=60).json().values():
        prefix = re.sub(r"^comfysup/[^/]+/", "", prefix_of(entry["prompt"][2]))  # comfysup's job folder
        if prefix in want:
            entries[prefix].append(entry)
    on_disk = Counter(re.sub(r"_\d{5}_\.png$", "", f.name) for f in (base / "output").rglob("*.png"))
    problems, runs = [], []
    # The log line comes after the history entry and the socket's end: the last one may be a moment late. And
    # a second run of a prompt may still wait in the server's queue: counted once the queue is empty.
    # ComfyUI empties its queue before it logs, so the count must also hold still over two looks half a second
    # apart.
    deadline, seen = time.monotonic() + 30, None
    while time.monotonic() < deadline:
        queue = requests.get(f"{url}/queue", timeout=60).json()
        count = executed(base)
        if not queue["queue_running"] and not queue["queue_pending"] and count >= posted:
            if seen == count:
                break
            seen = count
            time.sleep(0.5)
            continue
        seen = None
        time.sleep(0.05)
    count = executed(base)
    if count != posted:
        problems.append(f"the server executed {count} prompts, {posted} were posted")
    for prefix in sorted(want):
        found = entries.get(prefix, [])
        if len(found) != 1:
            problems.append(f"{prefix}: {len(found)} history entries")
            continue
        status = found[0]["status"]
        stamps = {kind: data["timestamp"] / 1000 for kind, data in status["messages"] if "timestamp" in data}
        if status["status_str"] != "success" or "execution_success" not in stamps:
            problems.append(f"{prefix}: {status['status_str']}")
            continue
        runs.append((stamps["execution_start"], stamps["execution_success"]))
        if on_disk[prefix] > 1:
            problems.append(f"{prefix}: {on_disk[prefix]} files in the server's output folder")
        paths = m.files.get(prefix) or []
        if not paths or not all(is_png(p) for p in paths):
            problems.append(f"{prefix}: no PNG on the client's side")
    runs.sort()
    gaps = [(b[0] - a[1]) * 1000 for a, b in itertools.pairwise(runs)]
    return {"problems": problems, "exec": sum(b - a for a, b in runs),
            "first": runs[0][0] - m.t0 if runs else float("nan"),
            "idle_ms": statistics.median(gaps) if gaps else float("nan")}


COLUMNS = (f"{'run':>3} {'workload':<8} {'tool':<15} {'N':>4} {'wall s':>7} {'jobs/s':>7} {'exec s':>7} "
           f"{'beyond s':>8} {'1st s':>6} {'idle ms':>7} {'CPU s':>6} {'CPU ms/job':>10} {'RSS MB':>7} "
           f"{'PSS MB':>7} {'load':>5}  verified")


def row_line(r: dict[str, Any]) -> str:
    ok = "ok" if not r["problems"] else f"{len(r['problems'])} PROBLEMS: {'; '.join(r['problems'][:3])}"
    return (f"{r['run']:>3} {r['workload']:<8} {r['tool']:<15} {r['n']:>4} {r['wall']:>7.2f} "
            f"{r['n'] / r['wall']:>7.1f} "
            f"{r['exec']:>7.2f} {r['wall'] - r['exec']:>8.2f} {r['first']:>6.2f} {r['idle_ms']:>7.1f} "
            f"{r['cpu']:>6.2f} {r['cpu'] / r['n'] * 1000:>10.2f} {r['rss']:>7.1f} {r['pss']:>7.1f} "
            f"{r['load']:>5.1f}  {ok}" + "".join(f"  {k} {v:.2f}" for k, v in r["notes"].items()))


def span(values: list[float], fmt: str = ".2f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}–{hi:{fmt}}"


def med(values: list[float], fmt: str = ".2f") -> str:
    """The median and, in brackets, the spread (min–max) of each run's figure: the goals are judged on medians."""
    return f"{statistics.median(values):{fmt}} ({span(values, fmt)})" if values else "–"


def summary(rows: list[dict[str, Any]], tools: list[str], workloads: list[str], labels: dict[str, str]) -> None:
    """One table a workload: each tool's median over the runs and its spread, the ratios to the bare client of
    the same run (paired, then the median of the ratios)."""
    for workload in workloads:
        mine = [r for r in rows if r["workload"] == workload]
        base = "bare" if any(r["tool"] == "bare" for r in mine) else "bare-cold"  # the cold table's own
        bare = {r["run"]: r for r in mine if r["tool"] == base}
        n = mine[0]["n"]
        print(f"\n| {n} {workload} prompts, median (min–max) over {len({r['run'] for r in mine})} runs | wall s | "
              "against the bare client | CPU ms a job | CPU against bare | its runner alone: CPU ms a job | against "
              "bare | beyond execution s | submit to first prompt s | idle ms | RSS MB | PSS MB |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for tool in tools:
            rs = [r for r in mine if r["tool"] == tool]
            if not rs:
                continue
            paired = [r for r in rs if r["run"] in bare]
            ratio = med([r["wall"] / bare[r["run"]]["wall"] for r in paired])
            cpu_ratio = med([r["cpu"] / bare[r["run"]]["cpu"] for r in paired if bare[r["run"]]["cpu"]])
            alone = [r for r in rs if SUBMIT_CPU in r["notes"]]
            runner = med([(r["cpu"] - r["notes"][SUBMIT_CPU]) / r["n"] * 1000 for r in alone]) if alone else "–"
            runner_ratio = med([(r["cpu"] - r["notes"][SUBMIT_CPU]) / bare[r["run"]]["cpu"] for r in alone
                                if r["run"] in bare and bare[r["run"]]["cpu"]]) if alone else "–"
            print(f"| {labels[tool]} | {med([r['wall'] for r in rs])} | {ratio} | "
                  f"{med([r['cpu'] / r['n'] * 1000 for r in rs])} | {cpu_ratio} | {runner} | {runner_ratio} | "
                  f"{med([r['wall'] - r['exec'] for r in rs])} | {med([r['first'] for r in rs])} | "
                  f"{med([r['idle_ms'] for r in rs], '.1f')} | {med([r['rss'] for r in rs], '.1f')} | "
                  f"{med([r['pss'] for r in rs], '.1f')} |")
        floor = {r["run"]: r for r in mine if r["tool"] == "bare-fsync"}
        for tool in (t for t in tools if t.startswith("comfysup")):
            alone = [r for r in mine if r["tool"] == tool and r["run"] in floor and SUBMIT_CPU in r["notes"]]
            if alone:
                print(f"\n{tool} against the bare client with its fsync (the floor), paired by run: the runner's CPU "
                      f"{med([(r['cpu'] - r['notes'][SUBMIT_CPU]) / floor[r['run']]['cpu'] for r in alone])}, "
                      f"wall {med([r['wall'] / floor[r['run']]['wall'] for r in alone])}")


def run_by_run(rows: list[dict[str, Any]], tools: list[str], workloads: list[str]) -> None:
    """the goals hold run by run: each comfysup tool against the bare client (and the proxy) that ran in the
    same run, its wall and CPU as ratios and the time beyond ComfyUI's own execution of both, side by side."""
    by = {(r["run"], r["workload"], r["tool"]): r for r in rows}
    base = "bare" if "bare" in tools else "bare-cold"
    peers = [t for t in tools if t.startswith("proxy")]
    for tool in (t for t in tools if t.startswith("comfysup")):
        head = ["run"]
        for w in workloads:
            head += [f"{w}: against {base}", *(f"{w}: against {p}" for p in peers), f"{w}: CPU against {base}",
                     f"{w}: beyond execution s, {base} / {tool}"]
        print(f"\n{tool}, run by run:\n\n| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for run in sorted({r["run"] for r in rows}):
            cells = [str(run)]
            for w in workloads:
                me, bare = by.get((run, w, tool)), by.get((run, w, base))
                cells.append(_ratio(me, bare, "wall"))
                cells += [_ratio(me, by.get((run, w, p)), "wall") for p in peers]
                cells.append(_ratio(me, bare, "cpu"))
                cells.append(" / ".join("–" if r is None else f"{r['wall'] - r['exec']:.2f}" for r in (bare, me)))
            print("| " + " | ".join(cells) + " |")


def _ratio(mine: dict[str, Any] | None, other: dict[str, Any] | None, key: str) -> str:
    return f"{mine[key] / other[key]:.2f}" if mine and other and other[key] else "–"
