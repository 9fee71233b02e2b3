"""The supervisor's parts one at a time: the ComfyUI command line (pure), GPU discovery with a fake NVML
and without a driver for real, sd_notify on real sockets, the port check, log rotation, the config
check, the systemd unit, and dying with the parent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from comfysup import gpus
from comfysup.config import build_config, check_supervisor, parse_gpus
from comfysup.errors import ConfigError
from comfysup.gpus import Slot
from comfysup.supervisor import notify, server
from comfysup.supervisor.process import ProcessOps, describe_status

# -- the ComfyUI command line ----------------------------------------------------------------------------


def test_command_line_for_a_gpu_slot(tmp_path: Path) -> None:
    config = build_config({"comfyui": {"main": "/opt/ComfyUI/main.py", "python": "/opt/venv/bin/python",
                                       "base_port": 8200, "base_directory": "var/comfyui",
                                       "extra_args": ["--highvram"],
                                       "extra_model_paths_config": "/etc/comfysup/models.yaml"}},
                          root=str(tmp_path), env={})
    base = tmp_path / "var" / "comfyui" / "gpu3"
    assert server.command_line(config, Slot("gpu3", 1, 3)) == [
        "/opt/venv/bin/python", "/opt/ComfyUI/main.py", "--listen", "127.0.0.1", "--port", "8201",
        "--cuda-device", "3", "--base-directory", str(base), "--database-url", f"sqlite:///{base}/comfyui.db",
        "--extra-model-paths-config", "/etc/comfysup/models.yaml", "--highvram"]


def test_command_line_for_a_cpu_slot_uses_this_python_and_no_cuda_device(tmp_path: Path) -> None:
    config = build_config({"comfyui": {"main": "ComfyUI/main.py", "gpus": "cpu:2"}}, root=str(tmp_path), env={})
    argv = server.command_line(config, Slot("cpu1", 1, None))
    assert argv[:2] == [sys.executable, str(tmp_path / "ComfyUI" / "main.py")]
    assert "--cpu" in argv and "--cuda-device" not in argv
    assert argv[argv.index("--port") + 1] == "8189"
    assert "--extra-model-paths-config" not in argv
    plan = server.plan(config, Slot("cpu1", 1, None))
    assert plan.url == "http://127.0.0.1:8189"
    assert plan.log_path == tmp_path / "var" / "comfyui" / "cpu1" / "comfyui.log"


def test_the_servers_environment_orders_cuda_devices_as_nvml_and_hides_systemds_socket() -> None:
    env = server.environment({"PATH": "/bin", "NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1"})
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["PATH"] == "/bin"
    assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"} & set(env)


def test_prepare_creates_custom_nodes(tmp_path: Path) -> None:
    config = build_config({"comfyui": {"gpus": "cpu:1"}}, root=str(tmp_path), env={})
    plan = server.plan(config, Slot("cpu0", 0, None))
    server.prepare(plan)
    assert (plan.directory / "custom_nodes").is_dir()


# -- GPUs: a fake NVML module, and this machine's missing driver for real -----------------------------------


class FakeNVML:
    """The few pynvml calls discovery makes, over a list of (name, uuid, total MiB)."""

    def __init__(self, devices: list[tuple[str, str, int]], fail_init: Exception | None = None) -> None:
        self.devices = devices
        self.fail_init = fail_init
        self.shut_down = False

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self.fail_init

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.devices[h][0].encode()

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return self.devices[h][1]

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(total=self.devices[h][2] * 2**20, used=512 * 2**20, free=0)


DEVICES = [("NVIDIA H100", "GPU-aaaa1111", 81559), ("NVIDIA H100", "GPU-bbbb2222", 81559),
           ("NVIDIA L4", "GPU-cccc3333", 23034)]


def test_nvml_finds_every_gpu_and_auto_makes_a_slot_each() -> None:
    fake = FakeNVML(DEVICES)
    found = gpus.discover(env={}, nvml=fake)  # type: ignore[arg-type]
    assert [(g.index, g.name, g.memory_total_mb) for g in found.gpus] == [
        (0, "NVIDIA H100", 81559), (1, "NVIDIA H100", 81559), (2, "NVIDIA L4", 23034)]
    assert fake.shut_down
    assert gpus.slots_for(parse_gpus("auto"), found) == [Slot("gpu0", 0, 0), Slot("gpu1", 1, 1), Slot("gpu2", 2, 2)]


def test_cuda_visible_devices_is_honoured_by_index_and_by_uuid() -> None:
    found = gpus.discover(env={"CUDA_VISIBLE_DEVICES": "2,0"}, nvml=FakeNVML(DEVICES))  # type: ignore[arg-type]
    assert [g.index for g in found.gpus] == [2, 0]
    assert "CUDA_VISIBLE_DEVICES" in found.note
    # slots keep the physical index as the device (--cuda-device), and their position for the port
    assert gpus.slots_for(parse_gpus("auto"), found) == [Slot("gpu2", 0, 2), Slot("gpu0", 1, 0)]
    by_uuid = gpus.discover(env={"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}, nvml=FakeNVML(DEVICES))  # type: ignore[arg-type]
    assert [g.index for g in by_uuid.gpus] == [1]


def test_a_listed_gpu_that_nvml_does_not_know_is_an_error() -> None:
    found = gpus.discover(env={}, nvml=FakeNVML(DEVICES[:1]))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"device\(s\) \[1\] not found"):
        gpus.slots_for(parse_gpus((0, 1)), found)


def test_a_driver_that_fails_to_load_is_reported_not_raised() -> None:
    found = gpus.discover(env={}, nvml=FakeNVML([], fail_init=RuntimeError("Driver Not Loaded")))  # type: ignore[arg-type]
    assert found.gpus == ()
    assert "no NVIDIA driver found" in found.note and "Driver Not Loaded" in found.note


def _has_nvidia_driver() -> bool:
    return Path("/proc/driver/nvidia").exists()


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_no_driver_for_real_is_a_finding_and_auto_says_what_to_do() -> None:
    found = gpus.discover(env={})
    assert found.gpus == ()
    assert "no NVIDIA driver" in found.note or "pynvml is not installed" in found.note
    with pytest.raises(ConfigError, match='set gpus = "cpu:N"'):
        gpus.slots_for(parse_gpus("auto"), found)


@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_comfysup_run_without_a_driver_exits_2_with_a_message(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[queue]\npath = "q.db"\n[comfyui]\ngpus = "auto"\n')
    result = subprocess.run([sys.executable, "-m", "comfysup", "run", "--config", str(config)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "no GPU is usable" in result.stderr and 'gpus = "cpu:N"' in result.stderr


# -- sd_notify --------------------------------------------------------------------------------------------


def _receiver(address: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + address[1:] if address.startswith("@") else address)
    sock.settimeout(2)
    return sock


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_notify_sends_one_datagram_per_message(tmp_path: Path, kind: str) -> None:
    address = str(tmp_path / "n.sock") if kind == "path" else f"@comfysup-test-{uuid.uuid4().hex}"
    with _receiver(address) as sock:
        n = notify.Notifier(env={"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "2000000"}, pid=os.getpid())
        n.ready("2 of 2 servers running")
        n.ready("again")  # once only
        n.watchdog(100.0)
        n.watchdog(100.5)  # within half the interval: no second ping
        n.watchdog(101.0)
        n.stopping()
        got = [sock.recv(4096).decode() for _ in range(4)]
    assert got == ["READY=1\nSTATUS=2 of 2 servers running", "WATCHDOG=1", "WATCHDOG=1",
                   "STOPPING=1\nSTATUS=stopping"]


def test_notify_outside_systemd_does_nothing_and_a_watchdog_for_another_pid_is_ignored() -> None:
    assert notify.send("READY=1", env={}) is False
    n = notify.Notifier(env={"NOTIFY_SOCKET": "@nobody", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"},
                        pid=os.getpid())
    assert n.watchdog_seconds == 0.0
    assert notify.send("READY=1", env={"NOTIFY_SOCKET": "@comfysup-nobody-listens"}) is False


# -- ports, logs, processes --------------------------------------------------------------------------------


def test_a_taken_port_is_reported_with_the_pid_and_command_that_hold_it() -> None:
    holder = subprocess.Popen([sys.executable, "-c",
                               "import socket,sys,time; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
                               "print(s.getsockname()[1], flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        message = server.port_holder("127.0.0.1", port)
        assert message is not None
        assert f"port {port} is already in use by pid {holder.pid}" in message
        assert "time.sleep(60)" in message
    finally:
        holder.kill()
        holder.wait()
    assert server.port_holder("127.0.0.1", port) is None


@pytest.mark.timeout(10)
def test_a_port_taken_by_a_connection_names_its_process_and_what_to_do_without_sudo() -> None:
    """What met .ci/run on a fresh machine: the port chosen for a server was the local end of some outgoing
    connection (the OS hands those out from the same range), with nobody listening on it."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    try:
        client.bind(("127.0.0.1", 0))
        client.connect(listener.getsockname())
        port = client.getsockname()[1]
        message = server.port_holder("127.0.0.1", port)
        assert message is not None
        assert f"a connection of pid {os.getpid()}" in message and "ip_local_port_range" in message, message
        assert "sudo" not in message
    finally:
        client.close()
        listener.close()


def test_log_rotation_copies_then_truncates_while_the_writer_keeps_appending(tmp_path: Path) -> None:
    path = tmp_path / "comfyui.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        os.write(fd, b"x" * 2000)
        assert server.rotate_log(path, 1000) is True
        os.write(fd, b"after rotation\n")
    finally:
        os.close(fd)
    assert path.read_bytes() == b"after rotation\n"  # O_APPEND: no hole of 2000 zero bytes
    assert (tmp_path / "comfyui.log.1").read_bytes() == b"x" * 2000
    assert server.rotate_log(path, 1000) is False


def test_a_spawned_server_dies_with_its_parent_even_on_kill_9(tmp_path: Path) -> None:
    """The OS edge alone: a middle process spawns a child with ProcessOps, then is SIGKILLed."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from comfysup.supervisor.process import ProcessOps\n"
        "pid = ProcessOps().spawn([sys.executable, '-c', 'import time; time.sleep(60)'], env={},"
        f" log_path=Path({str(tmp_path / 'child.log')!r}))\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    middle = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert middle.stdout is not None
    child = int(middle.stdout.readline())
    assert psutil.Process(child).ppid() == middle.pid
    assert os.getpgid(child) == child  # its own process group
    middle.send_signal(signal.SIGKILL)
    middle.wait()
    assert wait_gone(child, 5.0), f"pid {child} outlived its killed parent"


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_wait_statuses_read_as_people_say_them() -> None:
    ops = ProcessOps()
    pid = ops.fork(lambda: 3)
    _, status = os.waitpid(pid, 0)
    assert describe_status(status) == "exit code 3"
    pid = ops.fork(lambda: os.kill(os.getpid(), signal.SIGKILL) or 0)
    _, status = os.waitpid(pid, 0)
    assert describe_status(status) == "killed by SIGKILL"


# -- config and the systemd unit ----------------------------------------------------------------------------


def test_a_runner_timeout_not_shorter_than_the_lease_is_refused_with_its_reason() -> None:
    config = build_config({"runner": {"lease_seconds": 30.0}, "supervisor": {"runner_timeout_seconds": 40.0}},
                          source="c.toml", env={})
    with pytest.raises(ConfigError, match=r"c.toml: \[supervisor\] runner_timeout_seconds = 40: must be shorter "
                                          r"than \[runner\] lease_seconds \(30\)"):
        check_supervisor(config)
    check_supervisor(build_config({}, env={}))  # the defaults are consistent


def test_systemd_unit_runs_this_comfysup_with_the_config_and_keeps_gpus_visible(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[queue]\npath = "var/queue.db"\n[store]\ndir = "/srv/results"\n'
                      '[comfyui]\ngpus = "cpu:1"\n[runner]\ngrace_seconds = 90\n')
    result = subprocess.run([sys.executable, "-m", "comfysup", "systemd-unit", "--config", str(config),
                             "--user", "render"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert exec_start.endswith(f" run --config {config.resolve()}")
    assert Path(exec_start.split("=", 1)[1].split()[0]).is_absolute()
    for expected in ("Type=notify", "KillMode=mixed", "TimeoutStopSec=120", "Restart=on-failure", "User=render",
                     "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=read-only"):
        assert expected in lines, expected
    # This config lives under /tmp (pytest's folder): PrivateTmp would hide it from the service, so the unit goes
    # without it and says so, at generation and in the unit.
    assert "PrivateTmp=yes" not in lines and any(line.startswith("# No PrivateTmp") for line in lines)
    assert "PrivateTmp=yes would hide it" in result.stderr
    assert any(line.startswith("WatchdogSec=") for line in lines)
    writable = next(line for line in lines if line.startswith("ReadWritePaths=")).split("=", 1)[1].split()
    assert sorted(writable) == sorted([str(tmp_path.resolve() / "var"), "/srv/results",
                                       str(tmp_path.resolve() / "var" / "comfyui")])
    assert not any(line.startswith(("PrivateDevices", "DevicePolicy")) for line in lines)


def test_systemd_unit_keeps_private_tmp_for_an_installation_outside_tmp() -> None:
    from comfysup.commands.systemd_unit import unit

    config = build_config({"queue": {"path": "/srv/comfysup/queue.db"}, "store": {"dir": "/srv/results"},
                           "comfyui": {"main": "/opt/ComfyUI/main.py", "base_directory": "/srv/comfysup/comfyui",
                                       "gpus": "cpu:1"}}, source="/etc/comfysup/config.toml", root="/etc/comfysup",
                          env={})
    if Path(sys.executable).absolute().as_posix().startswith(("/tmp/", "/var/tmp/")):
        pytest.skip("this Python itself lives under /tmp, so the unit rightly goes without PrivateTmp")
    lines = unit(config, Path("/etc/comfysup/config.toml"), "render").splitlines()
    assert "PrivateTmp=yes" in lines and not any(line.startswith("# No PrivateTmp") for line in lines)
