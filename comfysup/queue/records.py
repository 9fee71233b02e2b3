"""Records from rows, by column name: both backends read rows that name their columns (SQLite's
``sqlite3.Row``, psycopg's ``dict_row``), so a column added or moved in a query cannot shift another."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from comfysup.queue import values
from comfysup.queue.base import Machine
from comfysup.workflows import apply_params

if TYPE_CHECKING:
    from comfysup.queue.run_values import Attempt, Delivery, EndedAttempt, JobPulse, JobRecord, RunningJob

Row = Mapping[str, Any]


def dumps(value: dict[str, Any] | None) -> str | None:
    """A trace or progress as stored: compact JSON, or NULL."""
    return None if value is None else json.dumps(value, separators=(",", ":"))


def loads(text: str | None) -> Any:
    return None if not text else json.loads(text)


def job_record(row: Row, attempts: list[Attempt]) -> JobRecord:
    """A job as ``get`` hands it out: its workflow rebuilt from the stored template and its ``set``."""
    params = json.loads(row["params"])
    template = json.loads(row["workflow"])
    return values.JobRecord(
        id=row["id"], state=row["state"], priority=row["priority"], attempt=row["attempt"],
        workflow=apply_params(template, params), extra_data=json.loads(row["extra_data"]),
        meta=json.loads(row["meta"]), params=params, workflow_name=row["workflow_name"],
        submitted_at=row["submitted_at"], run_after=row["run_after"], owner=row["owner"], server=row["server"],
        lease_until=row["lease_until"], started_at=row["started_at"], finished_at=row["finished_at"],
        reason=row["reason"],
        outputs=[values.Output(**o) for o in json.loads(row["outputs"])] if row["outputs"] else [],
        cancel_requested=bool(row["cancel_requested"]), attempts=attempts, machine=row["machine"],
        spec_hash=row["spec_hash"], last_server=row["last_server"], last_prompt_number=row["last_prompt_number"],
        progress=loads(row["progress"]), callback_url=row["callback_url"], model_key=row["model_key"],
        template=template, waiting_since=row["waiting_since"], staged_at=row["staged_at"],
        staged_in=row["staged_in"], tenant=row["tenant"])


def attempt(row: Row) -> Attempt:
    return values.Attempt(attempt=row["attempt"], owner=row["owner"], server=row["server"],
                          started_at=row["started_at"], ended_at=row["ended_at"], outcome=row["outcome"],
                          reason=row["reason"],
                          prompt_number=row["prompt_number"], kind=row["kind"], trace=loads(row["trace"]))


def running_job(row: Row) -> RunningJob:
    return values.RunningJob(id=row["id"], owner=row["owner"], server=row["server"], attempt=row["attempt"],
                             started_at=row["started_at"], lease_until=row["lease_until"],
                             progress=loads(row["progress"]), waiting_since=row["waiting_since"])


def ended_attempt(row: Row) -> EndedAttempt:
    return values.EndedAttempt(job_id=row["job_id"], attempt=row["attempt"], outcome=row["outcome"], kind=row["kind"],
                               started_at=row["started_at"], ended_at=row["ended_at"], nodes_run=row["nodes_run"],
                               nodes_cached=row["nodes_cached"], workflow_name=row["workflow_name"],
                               submitted_at=row["submitted_at"], first_started_at=row["first_started_at"],
                               comfyui_wait_s=row["comfyui_wait_s"], run_s=row["run_s"],
                               first_comfyui_wait_s=row["first_comfyui_wait_s"])


def delivery(row: Row, next_at: Any = ...) -> Delivery:
    """A webhook delivery; ``next_at`` given: the end of the hold this deliverer just took."""
    return values.Delivery(id=row["id"], job_id=row["job_id"], url=row["url"], attempts=row["attempts"],
                           created_at=row["created_at"], next_at=row["next_at"] if next_at is ... else next_at,
                           last_status=row["last_status"], last_error=row["last_error"],
                           delivered_at=row["delivered_at"])


def machine(row: Row) -> Machine:
    return Machine(host=row["host"], pid=row["pid"], slots=json.loads(row["slots"]), started_at=row["started_at"],
                   heartbeat_at=row["heartbeat_at"], age_seconds=max(0.0, row["age"]))


def pulse(row: Row) -> JobPulse:
    return values.JobPulse(id=row["id"], state=row["state"], attempt=row["attempt"],
                           cancel_requested=bool(row["cancel_requested"]), progress=loads(row["progress"]),
                           waiting_since=row["waiting_since"])
