"""Rewrite calls of the queue's old flat methods to its roles: ``queue.claim(`` -> ``queue.leases.claim(``.

Run from the repository root on files that still call the flat queue (e.g. after merging a branch written
against it): ``python tools/queue_roles_codemod.py comfysup/runner/*.py tests/integration/test_x.py``. Only the
receivers named in RECEIVERS are rewritten (the names the code gives a queue), so ``dict.get`` is left alone; a
receiver of that name that is no comfysup queue (a stdlib queue ``q``, an HTTP client ``target``) is rewritten too,
so read the diff. Running it twice changes nothing more.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROLES = {
    "leases": "claim complete_and_claim heartbeat record_prompt set_waiting attempt_urls set_progress complete "
              "retry_later dead cancelled release release_owner",
    "intake": "submit cancel requeue_dead prune prunable",
    "reads": "get ids_starting get_many iter_jobs newest status queue_position states output_asset pulses "
             "finished_counts ended_since ended_count ended_keys running_owners active_count",
    "deliveries": "deliveries pending_deliveries claim_deliveries delivery_result pending_announcements "
                  "mark_announced announcement_backlog announcements",
    "fleet": "record_catalogue catalogues refuse register_machine machine_heartbeat machines",
    "endpoints": "advertise_api withdraw_api api_endpoint",
    "previews": "set_preview previews",
    "assets": "read_asset assets_needed server_assets record_upload touch_upload forget_upload asset_totals "
              "add_api_asset mint_api_asset api_asset has_asset asset_size delete_api_asset asset_file asset_chunk "
              "prune_assets asset_bucket assets_dir",
}
ROLE_OF = {name: role for role, names in ROLES.items() for name in names.split()}
RECEIVERS = ("q", "q1", "q2", "queue", "queue2", "queue_a", "queue_b", "runner_queue", "self.queue", "self._queue",
             "self.q", "state.queue", "self.state.queue", "runner.queue", "ctx.queue", "self.ctx.queue",
             "attempt.queue", "station.queue", "self.station.queue", "context.queue", "pg", "lite", "source",
             "target", "other", "h.queue", "run.queue", "self.run.queue", "fleet.queue")
NAMES = "|".join(ROLE_OF)
CALL = re.compile(r"(?<![\w.])(" + "|".join(re.escape(r) for r in RECEIVERS) + r")\.(" + NAMES + r")\b(?!\.)")
MADE = re.compile(r"\b((?:SQLiteQueue|PostgresQueue|open_queue)\([^()\n]*\))\.(" + NAMES + r")\b(?!\.)")
r"""``(?!\.)``: ``queue.deliveries.x`` is the role already (two roles share a name with one of their methods)."""


def rewrite(text: str) -> str:
    def role(m: re.Match[str]) -> str:
        return f"{m.group(1)}.{ROLE_OF[m.group(2)]}.{m.group(2)}"

    return MADE.sub(role, CALL.sub(role, text))


def main(paths: list[str]) -> None:
    for path in map(Path, paths):
        text = path.read_text(encoding="utf-8")
        new = rewrite(text)
        if new != text:
            path.write_text(new, encoding="utf-8")
            print(path)


if __name__ == "__main__":
    main(sys.argv[1:])
