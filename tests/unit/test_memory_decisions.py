"""the pure decisions: which execution errors leave the device unusable, when an OOM is retried on the same
server, a warm-up's failure as a failed start, and GET /ready's answer from the state file and the queue."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from comfysup.comfy.errors import DEVICE_LOST, execution_failure, is_device_lost
from comfysup.runner.memory import POST_AGAIN, RELEASE, after_oom
from comfysup.slotstate import readiness
from comfysup.supervisor.policy import Action, Limits, Policy, State

LIMITS = Limits(startup_seconds=10.0, quick_failure_seconds=30.0, max_quick_failures=2, max_delay_seconds=60.0,
                stop_seconds=5.0)


# Recorded on an NVIDIA H200 with torch 2.11.0+cu130: what a node raises on a real GPU, typed as ComfyUI
# names it (module.qualname). A device-side assert fails every later CUDA call of the process the same way.
REAL_OOM = ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 931322.58 GiB. GPU 0 has a total "
            "capacity of 139.80 GiB of which 139.29 GiB is free. Including non-PyTorch memory, this process has 518.00 "
            "MiB memory in use. Of the allocated memory 0 bytes is allocated by PyTorch, and 0 bytes is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
REAL_ASSERT = ("torch.AcceleratorError", "CUDA error: device-side assert triggered\nSearch for `cudaErrorAssert' "
               "in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
               "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
               "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n")


@pytest.mark.parametrize(("kind", "message", "lost"), [
    (*REAL_ASSERT, True),
    ("RuntimeError", "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be ...", True),
    ("torch.AcceleratorError", "CUDA error: device-side assert triggered", True),
    ("RuntimeError", "CUDA error: unspecified launch failure", True),
    ("RuntimeError", "No CUDA GPUs are available; no CUDA-capable device is detected", True),
    ("torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 1.25 GiB", False),
    (*REAL_OOM, False),
    ("IndexError", "index 3 is out of bounds for dimension 3 with size 3", False),
    ("RuntimeError", "mat1 and mat2 shapes cannot be multiplied (77x768 and 1024x320)", False),
])
def test_a_lost_device_is_told_from_other_errors(kind: str, message: str, lost: bool) -> None:
    error = {"exception_type": kind, "exception_message": message, "node_id": "3", "node_type": "KSampler"}
    assert is_device_lost(error) is lost
    failure = execution_failure(error)
    if lost:  # the job may well run on a healthy server: transient, and the server is restarted
        assert (failure.kind, failure.transient) == (DEVICE_LOST, True)
    else:
        assert failure.kind != DEVICE_LOST
    assert failure.kind == "oom" or kind != "torch.OutOfMemoryError"


def test_nvml_says_what_the_servers_processes_hold() -> None:
    """GpuSampler.process_memory_mb against NVML's answer as an H200 gave it (pid, usedGpuMemory: 3 GiB of tensor
    and the CUDA context), through a stand-in module: this machine has no driver."""
    from types import SimpleNamespace

    from comfysup.gpus import GpuSampler

    procs = [SimpleNamespace(pid=581, usedGpuMemory=3764387840), SimpleNamespace(pid=77, usedGpuMemory=None)]
    nvml = SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetComputeRunningProcesses=lambda h: procs if h == 0 else [])
    sampler = GpuSampler(env={}, nvml=nvml)  # type: ignore[arg-type]
    assert sampler.process_memory_mb(0, {581, 582}) == pytest.approx(3590.0, abs=1)
    assert sampler.process_memory_mb(0, {77}) == 0.0 and sampler.process_memory_mb(1, {581}) == 0.0

    def no_driver() -> None:
        raise OSError("NVML Shared Library Not Found")

    assert GpuSampler(env={}, nvml=SimpleNamespace(nvmlInit=no_driver)).process_memory_mb(0, {581}) is None


def test_in_a_container_a_server_alone_on_its_gpu_holds_what_the_gpu_holds() -> None:
    """NVML names processes by the host's PIDs inside a container (seen on an H200 under gVisor: a server holding
    2 GiB, the idle watch read 0 MiB and never freed it). A server alone on its GPU is then taken to hold the
    GPU's used memory; never when a live process here is one NVML lists (another program's memory is not ours)."""
    import os
    from types import SimpleNamespace

    from comfysup.gpus import GpuSampler

    not_here = 2**22 + 12345  # above Linux's pid_max: no process here has it
    procs = [SimpleNamespace(pid=not_here, usedGpuMemory=2 * 2**30)]
    nvml = SimpleNamespace(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: i,
                           nvmlDeviceGetComputeRunningProcesses=lambda h: procs,
                           nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=3 * 2**30, total=140 * 2**30))
    sampler = GpuSampler(env={}, nvml=nvml)  # type: ignore[arg-type]
    assert sampler.process_memory_mb(0, {581}, whole_device=True) == pytest.approx(3072.0)
    assert sampler.process_memory_mb(0, {581}) == 0.0  # two servers share the GPU: cannot tell whose
    procs[:] = []  # NVML lists nobody, the memory is still used
    assert sampler.process_memory_mb(0, {581}, whole_device=True) == pytest.approx(3072.0)
    procs[:] = [SimpleNamespace(pid=os.getpid(), usedGpuMemory=2**30)]  # another program of this machine
    assert sampler.process_memory_mb(0, {581}, whole_device=True) == 0.0


@pytest.mark.parametrize(("kind", "retried", "own", "behind", "expected"), [
    ("oom", False, True, False, POST_AGAIN),
    ("oom", True, True, False, None),  # once per attempt: a second OOM takes the normal retry path
    ("oom", False, False, False, None),  # a run caught up on a peer server is that server's
    ("oom", False, True, True, RELEASE),  # a job of ours waits behind it and starts first: back to the queue
    ("oom", True, True, True, None),
    ("execution_error", False, True, False, None),
    (DEVICE_LOST, False, True, False, None),
])
def test_an_oom_is_run_again_once_uncounted(kind: str, retried: bool, own: bool, behind: bool,
                                            expected: str | None) -> None:
    assert after_oom(kind, retried, own, behind) == expected


def test_a_failed_warm_up_is_a_quick_failure_that_kills_the_server() -> None:
    policy = Policy(LIMITS)
    policy.spawned(0.0)
    assert policy.start_failed(1.0, "warm-up failed: boom") == [Action.KILL]
    assert policy.state is State.BACKOFF and policy.quick_failures == 1 and "warm-up failed: boom" in policy.reason
    assert policy.transition(1.5, exited="signal 9") == []  # its exit is not counted again
    assert policy.transition(2.0) == [Action.SPAWN]
    policy.spawned(2.0)
    assert policy.start_failed(3.0, "warm-up failed: boom") == [Action.KILL]
    assert policy.state is State.FAILED and "2 quick failures in a row" in policy.reason
    assert Policy(LIMITS, state=State.RUNNING, started_at=0.0).start_failed(1.0, "late") == []


def state(*slots: dict[str, Any]) -> dict[str, Any]:
    return {"pid": os.getpid(), "state": "running", "updated_at": time.time(), "slots": list(slots)}


def test_ready_once_a_slot_is_warm_and_while_the_queue_per_slot_is_in_bounds() -> None:
    assert not readiness(None, 0, 0).ready
    warming = state({"name": "gpu0", "state": "starting", "warming": True, "ready": False})
    answer = readiness(warming, 0, 0)
    assert not answer.ready and answer.reason == "no slot is ready yet (gpu0: warming up)"
    two = state({"name": "gpu0", "ready": True}, {"name": "gpu1", "state": "starting", "ready": False})
    assert readiness(two, 100, 0).ready  # no bound
    assert readiness(two, 2, 2.0).ready
    above = readiness(two, 3, 2.0)
    assert not above.ready and above.ready_slots == 1 and "3 queued job(s) for 1 ready slot(s)" in above.reason
    assert above.body() == {"status": "not_ready", "reason": above.reason, "ready_slots": 1, "queued_jobs": 3}
    stale = {**two, "updated_at": time.time() - 60}
    assert not readiness(stale, 0, 0).ready


def test_status_and_the_page_show_the_warm_up_and_the_memory_recoveries() -> None:
    from comfysup.commands.status import render_slots
    from comfysup.slotstate import memory_note, warmup_cell

    warm = {"name": "gpu0", "state": "running", "warmup_seconds": 2.04, "warmup_failures": 1, "oom_frees": 2,
            "oom_retries": 2, "device_restarts": 0, "reason": None}
    assert warmup_cell(warm) == "2.0 s (1 failed)" and warmup_cell({"warming": True}) == "warming"
    assert warmup_cell({}) == "-"
    assert memory_note(warm) == "OOM /free 2, OOM retried 2" and memory_note({}) == ""
    text = render_slots(state(warm), time.time())
    assert "warm-up" in text.splitlines()[1] and "2.0 s (1 failed)" in text and "OOM /free 2" in text


def launched_unit() -> Any:
    from comfysup.supervisor.children import Unit, new_shared

    server = Policy(LIMITS, state=State.RUNNING, started_at=0.0, spawned_once=True)
    return Unit(name="gpu0", device="cuda:0", url="http://127.0.0.1:1", plan=None, server=server,
                runner=Policy(LIMITS), shared=new_shared(), server_pid=4242)


def test_vram_held_while_idle_is_freed_then_the_server_restarted() -> None:
    """[comfyui] idle_vram_free_mb: above it while idle → POST /free; still above at the next look with no job in
    between → drained (restarted once its runner holds nothing); a job in between makes it a first look again."""
    from comfysup.supervisor.vram import idle_look

    unit, frees = launched_unit(), []
    unit.shared.busy = 1  # what a runner waiting for work keeps (its last may_claim said yes): still idle
    unit.shared.waiting = 1
    held = {"mb": 9000.0}

    def look(now: float) -> None:
        idle_look(unit, now, 4000, lambda u: held["mb"], lambda u: frees.append(now) or True)

    look(1.0)
    assert frees == [1.0] and unit.idle_frees == 1 and unit.draining is None
    unit.shared.jobs += 1  # a job ran since: its models are loaded again, which is no leak yet
    look(2.0)
    assert frees == [1.0, 2.0] and unit.draining is None
    look(3.0)
    assert unit.idle_restarts == 1 and unit.draining is not None and "9000 MiB" in unit.draining
    unit.draining = None
    held["mb"] = 100.0
    look(4.0)
    assert len(frees) == 2 and unit.idle_vram_mb is None
    held["mb"] = 9000.0
    unit.shared.job = b"some-job"  # running a job: not idle, not looked at
    look(5.0)
    assert len(frees) == 2
    unit.shared.job = b""
    idle_look(unit, 6.0, 4000, lambda u: None, lambda u: True)  # no NVML: nothing is known, nothing done
    assert len(frees) == 2 and unit.draining is None


def test_a_server_running_the_job_a_hand_off_posted_is_not_idle() -> None:
    """From an attempt's end on the server to the next attempt's start the slot names no job, but the job its
    hand-off posted runs on the server meanwhile (the attempt before downloads its outputs): no /free there,
    which would unload that job's models after it, and no restart."""
    from comfysup.supervisor.vram import idle_look

    unit, frees = launched_unit(), []
    unit.shared.busy, unit.shared.waiting, unit.shared.job = 1, 0, b""  # the runner took a job: not waiting
    for now in (1.0, 2.0, 3.0):
        idle_look(unit, now, 4000, lambda u: 9000.0, lambda u: frees.append(u) or True)
    assert frees == [] and unit.draining is None and unit.idle_restarts == 0


def test_vram_a_restart_did_not_give_back_brings_no_second_restart_until_a_job_runs() -> None:
    """In a container NVML may count another process on the server's GPU as the server's (whole_device): neither
    /free nor a restart lowers it, and restarting again every other look would never end."""
    from comfysup.supervisor.vram import idle_look

    unit, frees = launched_unit(), []
    unit.shared.busy, unit.shared.waiting = 1, 1

    def look(now: float) -> None:
        idle_look(unit, now, 4000, lambda u: 9000.0, lambda u: frees.append(u) or True)

    look(1.0)
    look(2.0)
    assert unit.idle_restarts == 1 and len(frees) == 1
    unit.draining = None  # restarted
    for now in (3.0, 4.0, 5.0, 6.0):
        look(now)
    assert unit.idle_restarts == 1 and len(frees) == 1 and unit.draining is None
    unit.shared.jobs += 1  # a job ran: the watch starts over
    look(7.0)
    look(8.0)
    assert len(frees) == 2 and unit.idle_restarts == 2


def test_a_restart_asked_for_a_lost_device_restarts_a_running_server_once() -> None:
    from comfysup.supervisor.vram import restart_step

    unit = launched_unit()
    assert restart_step(unit, 1.0) == []
    unit.shared.restart = b"the device is unusable after: execution_error ..."
    assert restart_step(unit, 2.0) == [Action.TERM] and unit.server.state is State.STOPPING
    assert restart_step(unit, 2.5) == []  # stopping already: its exit brings the new server


def test_a_warm_up_that_cannot_be_read_stops_the_start_with_what_is_wrong(tmp_path: Any) -> None:
    from comfysup.config import load_config
    from comfysup.errors import ConfigError
    from comfysup.runner.warmup import load

    def config(name: str) -> Any:
        path = tmp_path / "config.toml"
        path.write_text(f'[queue]\npath = "q.db"\n[comfyui]\nwarmup = "{name}"\n')
        return load_config(str(path), env={})

    assert load(config("")) is None
    with pytest.raises(ConfigError, match=r"\[comfyui\] warmup = 'missing.json': no such file"):
        load(config("missing.json"))
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="not JSON"):
        load(config("broken.json"))
    (tmp_path / "ui.json").write_text('{"nodes": [], "links": []}')
    with pytest.raises(ConfigError, match="UI format"):
        load(config("ui.json"))
    (tmp_path / "ok.json").write_text('{"1": {"class_type": "EmptyImage", "inputs": {}}}')
    assert load(config("ok.json")) == {"1": {"class_type": "EmptyImage", "inputs": {}}}
