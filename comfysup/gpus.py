"""GPU discovery through NVML, honouring CUDA_VISIBLE_DEVICES, and the slots that follow from ``gpus``.

ComfyUI's ``--cuda-device N`` sets CUDA_VISIBLE_DEVICES=N in its own process, overriding what it
inherited; so a slot's device is the physical (NVML) index, and the servers are started with
CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA numbers devices as NVML does.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

from comfysup.config import GpuSpec
from comfysup.errors import ConfigError


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    uuid: str
    memory_total_mb: int
    memory_used_mb: int = 0


@dataclass(frozen=True)
class Discovery:
    gpus: tuple[Gpu, ...]
    note: str
    """What was found or why nothing was: shown to the person (no driver, filtered by the variable…)."""


@dataclass(frozen=True)
class Slot:
    """One ComfyUI server and its runner: ``gpu0`` on CUDA device 0, or ``cpu1`` on the CPU."""

    name: str
    index: int
    """Position among the slots: the port is base_port + index."""
    device: int | None
    """The CUDA device, or None for a CPU slot (--cpu)."""


def _load_nvml() -> ModuleType | None:
    """pynvml, without its import-time FutureWarning about its package name: a person can do nothing
    about it, and a bare line on stderr breaks ``--log-format json``'s one object per line."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)
            import pynvml
    except ImportError:
        return None
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover(env: Mapping[str, str] | None = None, nvml: ModuleType | None = None) -> Discovery:
    """The GPUs this process may use. Never raises: no driver is a finding, reported in ``note``."""
    env = os.environ if env is None else env
    nvml = nvml if nvml is not None else _load_nvml()
    if nvml is None:
        return Discovery((), "pynvml is not installed; no GPU discovery")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return Discovery((), f"no NVIDIA driver found (NVML: {_text(exc) or type(exc).__name__})")
    try:
        found = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            found.append(Gpu(index=i, name=_text(nvml.nvmlDeviceGetName(handle)),
                             uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                             memory_total_mb=int(memory.total) // 2**20,
                             memory_used_mb=int(memory.used) // 2**20))
    except Exception as exc:
        return Discovery((), f"NVML failed while listing GPUs: {_text(exc) or type(exc).__name__}")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return Discovery(tuple(found), f"{len(found)} GPU(s) found by NVML")
    chosen = _filter_visible(found, visible)
    return Discovery(chosen, f"{len(chosen)} of {len(found)} GPU(s), as CUDA_VISIBLE_DEVICES={visible!r} allows")


def _filter_visible(found: list[Gpu], visible: str) -> tuple[Gpu, ...]:
    """CUDA's rules: indices or (prefixes of) UUIDs, in the given order; parsing stops at the first bad entry."""
    out: list[Gpu] = []
    for entry in (e.strip() for e in visible.split(",")):
        match = None
        if entry.isdigit():
            match = next((g for g in found if g.index == int(entry)), None)
        elif entry:
            match = next((g for g in found if g.uuid.startswith(entry) or g.uuid == f"GPU-{entry}"), None)
        if match is None:
            break
        if match not in out:
            out.append(match)
    return tuple(out)


def slots_for(spec: GpuSpec, discovery: Discovery | None = None) -> list[Slot]:
    """The slots to run. ``auto`` with no GPU is an error that says so, rather than silently the CPU."""
    if spec.mode == "cpu":
        return [Slot(f"cpu{i}", i, None) for i in range(spec.cpu_slots)]
    if spec.mode == "list":
        if discovery is not None and discovery.gpus:
            known = {g.index for g in discovery.gpus}
            missing = [i for i in spec.indices if i not in known]
            if missing:
                raise ConfigError(f"[comfyui] gpus = {list(spec.indices)}: device(s) {missing} not found "
                                  f"({discovery.note})")
        return [Slot(f"gpu{d}", i, d) for i, d in enumerate(spec.indices)]
    if discovery is None or not discovery.gpus:
        note = discovery.note if discovery else "no discovery"
        raise ConfigError(f"[comfyui] gpus = \"auto\" but no GPU is usable: {note}. On a machine without "
                          "an NVIDIA GPU set gpus = \"cpu:N\" to run N ComfyUI servers with --cpu")
    return [Slot(f"gpu{g.index}", i, g.index) for i, g in enumerate(discovery.gpus)]


@dataclass(frozen=True)
class GpuSample:
    """What metrics export per GPU, read from NVML at scrape time."""

    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization: float | None
    """Fraction of the last sample period a kernel ran (0..1); None where NVML does not tell."""
    uuid: str = ""


class GpuSampler:
    """NVML kept open for the life of the process that scrapes it (nvmlInit is slow to repeat per scrape).

    Never raises: without a driver (or pynvml) ``sample`` returns nothing and per-GPU metrics are absent,
    which is what a machine without GPUs should show. GPUs hidden by ``CUDA_VISIBLE_DEVICES`` are left out.
    """

    def __init__(self, env: Mapping[str, str] | None = None, nvml: ModuleType | None = None) -> None:
        self.env = os.environ if env is None else env
        self.nvml = nvml if nvml is not None else _load_nvml()
        self.ready = False
        self.note = ""
        if self.nvml is None:
            self.note = "pynvml is not installed"
            return
        try:
            self.nvml.nvmlInit()
            self.ready = True
        except Exception as exc:
            self.note = f"no NVIDIA driver found (NVML: {_text(exc) or type(exc).__name__})"

    def sample(self) -> list[GpuSample]:
        if not self.ready or self.nvml is None:
            return []
        nvml = self.nvml
        out: list[GpuSample] = []
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                try:
                    utilization: float | None = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu) / 100.0
                except Exception:  # some devices (MIG, vGPU) do not report it
                    utilization = None
                out.append(GpuSample(i, _text(nvml.nvmlDeviceGetName(handle)), int(memory.used), int(memory.total),
                                     utilization, _text(nvml.nvmlDeviceGetUUID(handle))))
        except Exception as exc:
            self.note = f"NVML failed: {_text(exc) or type(exc).__name__}"
            return []
        visible = self.env.get("CUDA_VISIBLE_DEVICES")
        if visible is None:
            return out
        gpus = [Gpu(s.index, s.name, s.uuid, 0) for s in out]
        keep = {g.index for g in _filter_visible(gpus, visible)}
        return [s for s in out if s.index in keep]

    def process_memory_mb(self, index: int, pids: set[int], whole_device: bool = False) -> float | None:
        """VRAM (MiB) that processes ``pids`` hold on GPU ``index`` (NVML's index: CUDA_DEVICE_ORDER=PCI_BUS_ID);
        None without NVML or when it cannot tell (the caller then watches nothing).

        Inside a container with a PID namespace of its own NVML names processes by the host's PIDs, or lists none
        (seen on an H200 under gVisor: a server holding 2 GiB, none of NVML's processes its PID). When none of
        NVML's processes is one of ``pids`` nor any other live process here, and ``whole_device`` (the server is
        the only one comfysup runs on that GPU), the GPU's used memory is what the server holds (its CUDA context
        and the driver's share included)."""
        if not self.ready or self.nvml is None:
            return None
        try:
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            mine = [p for p in procs if p.pid in pids]
            if mine or not whole_device or any(psutil.pid_exists(p.pid) for p in procs):
                return sum(p.usedGpuMemory for p in mine if isinstance(p.usedGpuMemory, int)) / 2**20
            return int(self.nvml.nvmlDeviceGetMemoryInfo(handle).used) / 2**20
        except Exception as exc:
            self.note = f"NVML failed: {_text(exc) or type(exc).__name__}"
            return None

    def close(self) -> None:
        if self.ready and self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:
                pass
            self.ready = False
