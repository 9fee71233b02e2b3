"""Step 2 of an attempt (docs/design.md), the part that talks to the server: deliver the job's input files, then POST
/prompt with the job's id. Used by the attempt's own post and by the post of a job taken ahead (comfysup.runner.ahead).
"""

from __future__ import annotations

from typing import Any

from comfysup.comfy import PromptRejected
from comfysup.queue.base import Claim
from comfysup.runner import outputs as job_outputs
from comfysup.runner.running import Context


def post_prompt(ctx: Context, claim: Claim, client_id: str) -> int:
    """POST ``claim``'s workflow (inputs delivered first); a refusal because an uploaded input vanished
    from the server is transient (comfysup.runner.inputs.InputDelivery.stale), any other 400 permanent."""
    try:
        return ctx.client.post_prompt(workflow_for(ctx, claim), claim.id, client_id, claim.extra_data)
    except PromptRejected as rejected:
        raise ctx.station.inputs.stale(rejected) or rejected from None

def workflow_for(ctx: Context, claim: Claim) -> dict[str, Any]:
    """The workflow to post to this runner's server: with the job's own output folder when comfysup can
    see the server's output folder (for adoption from disk), else as it was submitted; its input files
    uploaded to the server first and named as ComfyUI expects (comfysup.runner.inputs)."""
    workflow = ctx.station.inputs.workflow(claim.workflow)
    if ctx.s.server not in ctx.s.output_dirs:
        return workflow
    return job_outputs.plan(workflow, claim.id).workflow
