"""A private RabbitMQ node for the tests that stop, restart or cut the broker (chaos rows R2 and R3).

``OwnBroker`` starts ``rabbitmq-server`` with a node name of its own, its AMQP listener and distribution port
on loopback ports the OS handed out (started again on new ones when another process took one first), its data,
logs, config and Erlang cookie in a folder of the test's, and no plugins (no management port). Faults are
injected with ``rabbitmqctl -n <its node>`` and reach nothing else: the machine's broker (127.0.0.1:5672), which
the other broker tests share, is never stopped. ``stop()`` (the context manager's exit) halts the node and kills
what is left of its process group.

Debian's ``/usr/sbin/rabbitmq-server`` is a wrapper that switches to the ``rabbitmq`` user (whose home holds the
machine's cookie), so the scripts are run from their own folder (``/usr/lib/rabbitmq/bin`` there).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pika

BIN_CANDIDATES = (Path("/usr/lib/rabbitmq/bin"),)
"""Where the real scripts live when ``rabbitmq-server`` on PATH is a wrapper (Debian, Ubuntu)."""

IN_USE = ("eaddrinuse", "dist_port_already_used", "address already in use", "could not listen",
          "could_not_start_listener")
"""What a node's output says when one of its ports was taken between our choice and its bind."""


def rabbitmq_bin() -> Path | None:
    """The folder holding the real ``rabbitmq-server`` and ``rabbitmqctl`` scripts, or None when not installed."""
    found = shutil.which("rabbitmq-server") or shutil.which("rabbitmq-server", path="/usr/sbin:/usr/local/sbin")
    candidates = [*BIN_CANDIDATES, *([Path(found).resolve().parent] if found else [])]
    for folder in candidates:
        if (folder / "rabbitmq-server").is_file() and (folder / "rabbitmqctl").is_file():
            return folder
    return None


def os_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports the OS hands out (bound together, so never the same one twice)."""
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
    try:
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class OwnBroker:
    """One private RabbitMQ node under ``folder``; ``url`` is its guest login on loopback."""

    def __init__(self, folder: Path, *, start_seconds: float = 60.0, tries: int = 5) -> None:
        self.folder = folder
        self.start_seconds = start_seconds
        self.tries = tries
        self.node = f"comfysup-test-{uuid.uuid4().hex[:10]}@localhost"
        self.port = 0
        self.dist_port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.bin = rabbitmq_bin()
        self.output = folder / "rabbitmq-server.1.out"  # the output of the latest start
        self.starts: list[str] = []  # one line per attempt, for messages

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def __enter__(self) -> OwnBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- starting -------------------------------------------------------------------------------------------

    def _files(self) -> None:
        home = self.folder / "home"
        for sub in ("home", "mnesia", "log", "plugins-expand", "schema", "config"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        cookie = home / ".erlang.cookie"  # rabbitmqctl with the same HOME reads the same cookie
        if not cookie.exists():
            cookie.write_text(secrets.token_hex(20).upper())
            cookie.chmod(0o400)
        (self.folder / "enabled_plugins").write_text("[].\n")  # no plugins: no management listener on 15672
        (self.folder / "advanced.config").write_text("[].\n")  # not the machine's /etc/rabbitmq/advanced.config
        (self.folder / "rabbitmq-env.conf").write_text("")  # not the machine's /etc/rabbitmq/rabbitmq-env.conf

    def _config(self) -> None:
        (self.folder / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.port}\n"
            "loopback_users.guest = true\n"  # guest, over loopback only (the only listener there is)
            "disk_free_limit.absolute = 10MB\n"  # a nearly full /tmp must not block the publishers
            "log.console = false\n"
            "log.file.level = info\n")

    def env(self) -> dict[str, str]:
        """The environment of the node and of every ``rabbitmqctl`` aimed at it (the same HOME: the same cookie)."""
        f = self.folder
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(f / "home"),
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_CONF_ENV_FILE": str(f / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(f / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(f / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(f / "enabled_plugins"),
            "RABBITMQ_MNESIA_BASE": str(f / "mnesia"),
            "RABBITMQ_LOG_BASE": str(f / "log"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(f / "plugins-expand"),
            "RABBITMQ_SCHEMA_DIR": str(f / "schema"),
            "RABBITMQ_GENERATED_CONFIG_DIR": str(f / "config"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(f / "feature_flags"),
            "RABBITMQ_PID_FILE": str(f / "rabbitmq.pid"),
            # The distribution port on loopback too, as the AMQP listener.
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
            "ERL_EPMD_ADDRESS": "127.0.0.1",  # an epmd this node has to start listens on loopback only
            "ERL_CRASH_DUMP": str(f / "log" / "erl_crash.dump"),
        })
        return env

    def start(self) -> None:
        if self.bin is None:
            raise RuntimeError("RabbitMQ is not installed (no rabbitmq-server on PATH nor in /usr/lib/rabbitmq/bin): "
                               "install the rabbitmq-server package (Debian: apt-get install rabbitmq-server)")
        self._files()
        for attempt in range(1, self.tries + 1):
            self.output = self.folder / f"rabbitmq-server.{attempt}.out"
            self.port, self.dist_port = os_ports(2)
            self._config()
            with self.output.open("wb") as out:
                self.proc = subprocess.Popen([str(self.bin / "rabbitmq-server")], env=self.env(), cwd=self.folder,
                                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True)  # its own group: stop() kills all of it
            began = time.monotonic()
            try:
                failure = self._wait_up()
            except BaseException:  # interrupted (a test's timeout): no node left behind
                self._kill(wait_seconds=0)
                raise
            self.starts.append(f"attempt {attempt}: ports {self.port}/{self.dist_port}, "
                               f"{time.monotonic() - began:.1f} s, {failure or 'up'}")
            if failure is None:
                return
            tail = self._output_tail()
            self._kill(wait_seconds=0)
            if not self._port_taken():
                raise RuntimeError(f"the test's RabbitMQ node {self.node} did not start: {failure}\n"
                                   f"{tail}\n(output: {self.output}, logs: {self.folder / 'log'})")
            # A port we were handed was taken before the node bound it: new ports, new start.
        raise RuntimeError(f"the test's RabbitMQ node {self.node} found its ports taken {self.tries} times: "
                           + "; ".join(self.starts))

    def _wait_up(self) -> str | None:
        """None once a guest login succeeds; else why not (the node exited, or did not answer in time)."""
        assert self.proc is not None
        deadline = time.monotonic() + self.start_seconds
        while time.monotonic() < deadline:
            status = _exit_status(self.proc.pid)
            if status is not None:
                return f"rabbitmq-server exited with {status}"
            if self._port_taken():  # before a login attempt that would meet whoever holds the port
                return "a port was taken"
            if self.answers():
                return None
            time.sleep(0.25)
        return f"no AMQP login at {self.url} after {self.start_seconds:g} s"

    def answers(self) -> bool:
        """A guest login succeeds (not only a TCP connection)."""
        params = pika.URLParameters(self.url)
        params.connection_attempts = 1
        params.socket_timeout = 2
        params.stack_timeout = 4  # not pika's 15 s: a listener that never speaks AMQP is no answer
        try:
            pika.BlockingConnection(params).close()
            return True
        except Exception:  # pika's own errors, and its connector's (a listener that is not AMQP: a handshake timeout)
            return False

    def _port_taken(self) -> bool:
        with contextlib.suppress(OSError):
            return any(word in self.output.read_text(errors="replace").lower() for word in IN_USE)
        return False

    def _output_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.output.read_text(errors="replace").splitlines()[-lines:])
        return ""

    # -- faults and the end ---------------------------------------------------------------------------------

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl -n <this node> args``; its output, or an AssertionError with what it said."""
        assert self.bin is not None
        done = subprocess.run([str(self.bin / "rabbitmqctl"), "-n", self.node, *args], env=self.env(),
                              cwd=self.folder, capture_output=True, timeout=timeout, check=False)
        if done.returncode:
            raise AssertionError(f"rabbitmqctl -n {self.node} {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}")
        return done.stdout.decode(errors="replace")

    def stop(self) -> None:
        """Halt the node (``rabbitmqctl stop``), then kill whatever is left of its process group."""
        if self.proc is None:
            return
        if _exit_status(self.proc.pid) is None:
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                self.ctl("stop", timeout=30)
        self._kill(wait_seconds=15)

    def _kill(self, wait_seconds: float) -> None:
        """Kill the node's process group, after up to ``wait_seconds`` for the node to exit on its own. The node
        is reaped only after the kill: until then its pid (the group's id) cannot name another process."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        deadline = time.monotonic() + wait_seconds
        while _exit_status(proc.pid) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _exit_status(pid: int) -> int | None:
    """The child's exit status once it has exited (left unreaped), else None."""
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return -1
    return None if info is None else info.si_status

