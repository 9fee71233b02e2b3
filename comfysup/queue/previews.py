"""The latest preview image of each running job: what the Comfy API v2 sends as SSE ``preview`` events.

ComfyUI sends a preview frame at every sampler step; the runner keeps only the newest in memory and writes it
here at most every ``[runner] preview_seconds`` (one row a job, replaced: ``n`` counts the replacements), fenced
like a progress write and not durable (a preview lost in a power cut is nothing to recover). The row goes in the
transaction that ends the attempt (comfysup.queue.ends ``end``) and with prune. The API's watcher reads ``n`` of
its watched running jobs each tick and the image only of those whose ``n`` moved, so an unchanged preview costs
a few bytes a tick, never its image.

A role of the queue over its database (comfysup.queue.db); the SQL is in sql/queries.sql (``set_preview``,
``preview_numbers``, ``previews``, ``forget_preview``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comfysup.queue import values
from comfysup.queue.db import Role, in_transaction
from comfysup.queue.values import Claim, Preview


class Previews(Role):
    """The previews of running jobs (see the module docstring)."""

    @in_transaction(durable=False)
    def set_preview(self, cur: Any, claim: Claim, node_id: str | None, content_type: str, data: bytes) -> None:
        """The claim's job's latest preview, replacing the one before (nothing when the claim is lost)."""
        cur.execute(self.db.sql["set_preview"], {"node_id": node_id, "content_type": content_type, "data": data,
                                                 "id": claim.id, "attempt": claim.attempt, "owner": claim.owner})

    def previews(self, ids: Sequence[str], known: Mapping[str, int]) -> dict[str, Preview]:
        """The previews of ``ids`` whose number is not the one in ``known`` (a job without one is left out)."""
        return self._moved(list(ids), known) if ids else {}

    @in_transaction(write=False)
    def _moved(self, cur: Any, ids: list[str], known: Mapping[str, int]) -> dict[str, Preview]:
        sql, id_list = self.db.sql, self.db.id_list
        moved = [str(r["job_id"]) for r in cur.execute(sql["preview_numbers"], {"ids": id_list(ids)}).fetchall()
                 if known.get(str(r["job_id"])) != int(r["n"])]
        if not moved:
            return {}
        rows = cur.execute(sql["previews"], {"ids": id_list(moved)}).fetchall()
        return {str(r["job_id"]): values.Preview(int(r["n"]), r["node_id"], str(r["content_type"]), bytes(r["data"]))
                for r in rows}
