"""A prompt stuck in a slot's ComfyUI server after /interrupt (comfysup.runner.stuck): restart the server.

The runner writes the prompt's id into its slot's shared block (``Shared.stuck``) and waits, holding the
claim; the supervisor restarts the server as it recycles one (SIGTERM, SIGKILL after the policy's stop
bound) and clears the field once the server's pid has been reaped: only then is the prompt certainly gone,
and only then does the runner record the attempt, so the job is never handed on while it still runs here.
A slot whose server is not the supervisor's ([[servers]]) is only shown out of service; its runner waits
for the server's queue to empty by itself.

:func:`decide` is pure (a table test sets a state and reads the answer); :func:`step` carries it out.
"""

from __future__ import annotations

import enum
import logging

from comfysup.runner.stuck import out_of_service_reason
from comfysup.supervisor.children import Unit
from comfysup.supervisor.policy import Action, State

log = logging.getLogger("comfysup.supervisor")


class Decision(enum.Enum):
    NOTHING = "nothing"
    RESTART = "restart"
    """The server that holds the prompt runs: restart it."""
    WAIT = "wait"
    """It is being stopped already: its exit clears the report."""
    CLEAR = "clear"
    """No server process holds the prompt any more (it is down, or a new one started): nothing to wait for."""


def decide(reported: bool, launched: bool, state: State | None, has_pid: bool) -> Decision:
    if not reported or not launched:
        return Decision.NOTHING
    if not has_pid or state in (State.STARTING, State.BACKOFF, State.FAILED, State.STOPPED):
        return Decision.CLEAR
    if state is State.RUNNING:
        return Decision.RESTART
    return Decision.WAIT


def stuck_prompt(unit: Unit) -> str:
    return bytes(unit.shared.stuck).decode(errors="replace")


def step(unit: Unit, now: float) -> list[Action]:
    """What the slot's server policy must do about a stuck prompt its runner reported."""
    prompt = stuck_prompt(unit)
    policy = unit.server
    decision = decide(bool(prompt), policy is not None, policy.state if policy else None, unit.server_pid is not None)
    if decision is Decision.CLEAR:
        server_gone(unit)
    if decision is not Decision.RESTART or policy is None:
        return []
    unit.stuck_restarts += 1
    log.error("%s: prompt %s did not leave ComfyUI's queue after /interrupt (a node that ignores the flag); "
              "restarting ComfyUI (pid %s)", unit.name, prompt, unit.server_pid, extra={"event": "stuck_restart"})
    return policy.transition(now, recycle=f"restarted: {out_of_service_reason(prompt)}")


def server_gone(unit: Unit) -> None:
    """The server's pid was reaped (or none runs): a prompt stuck in it is gone; the runner may go on."""
    prompt = stuck_prompt(unit)
    if prompt and unit.server is not None:
        unit.shared.stuck = b""
        log.info("%s: ComfyUI is gone, and with it stuck prompt %s; its job is recorded and handed on",
                 unit.name, prompt)


def reason(unit: Unit) -> str | None:
    """For the state file: why the slot takes no job because of a stuck prompt, or None."""
    prompt = stuck_prompt(unit)
    return out_of_service_reason(prompt) if prompt else None
