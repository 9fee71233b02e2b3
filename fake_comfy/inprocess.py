"""FakeComfy: the fake server in a background thread of the test process, on a free loopback port.

The event loop, the aiohttp server and the worker live in one thread that `start()` creates and
`stop()` joins; everything a test calls from its own thread (stats, script, knobs) is thread-safe.
The Recorder and the Script belong to this object, not to the server, so they survive `stop()`,
a scripted crash and `start()` again (a restart keeps the port when it is free, and starts, like a
restarted ComfyUI, with an empty queue, history and cache).

A "crash" word cannot kill the test process, so in-process it stops the server abruptly instead:
every connection is aborted without a close frame (HTTP and WebSocket alike), the listening socket
is closed so later connections are refused, the running prompt is abandoned without history, and
the thread ends. `crashed` is then True and `running` False until `start()` is called again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .models import parse_models
from .options import MAXIMUM_HISTORY_SIZE, Options
from .script import Script
from .server import FakeServer
from .stats import Recorder
from .version import default_version, normalize


class FakeComfy:
    """A scriptable ComfyUI 0.3.64 for tests; a context manager that starts and stops it."""

    def __init__(
        self,
        base_directory: str | os.PathLike[str] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        node_ms: float = 5.0,
        load_ms: float = 50.0,
        history_delay_ms: float = 0.0,
        script: Sequence[str] = (),
        script_by_id: Mapping[str, Sequence[str]] | None = None,
        script_file: str | os.PathLike[str] | None = None,
        busy: int = 0,
        cpu: bool = True,
        cuda_device: int | str | None = None,
        output_directory: str | os.PathLike[str] | None = None,
        max_history: int = MAXIMUM_HISTORY_SIZE,
        exec_log: str | Path | None = None,
        hostile_seed: int | None = None,
        hostile_rate: float = 0.3,
        hostile_only: Sequence[str] = (),
        hostile_trickle_s: float = 1.0,
        hostile_cap_s: float = 60.0,
        without_nodes: Sequence[str] = (),
        choices: Mapping[str, Sequence[str]] | None = None,
        models: Mapping[str, Sequence[str]] | str | None = None,
        step_ms: float = 2.0,
        comfyui_version: str | None = None,
        database_url: str | None = None,
        disable_assets: bool = False,
        cache_classic: bool = False,
        ram_pressure: bool = False,
    ) -> None:
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if base_directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="fake_comfy-")
            base_directory = self._tmp.name
        self.options = Options(
            listen=host,
            port=port,
            base_directory=Path(base_directory),
            output_directory=Path(output_directory) if output_directory is not None else None,
            cuda_device=cuda_device,
            cpu=cpu,
            node_ms=node_ms,
            load_ms=load_ms,
            history_delay_ms=history_delay_ms,
            busy=busy,
            max_history=max_history,
            exec_log=Path(exec_log) if exec_log is not None else None,
            hostile_seed=hostile_seed,
            hostile_rate=hostile_rate,
            hostile_only=list(hostile_only),
            hostile_trickle_s=hostile_trickle_s,
            hostile_cap_s=hostile_cap_s,
            without_nodes=list(without_nodes),
            choices={k: list(v) for k, v in (choices or {}).items()},
            models=parse_models(models) if isinstance(models, str) else (
                None if models is None else {**parse_models(""), **{k: list(v) for k, v in models.items()}}),
            step_ms=step_ms,
            comfyui_version=normalize(comfyui_version) if comfyui_version else default_version(),
            database_url=database_url,
            disable_assets=disable_assets,
            cache_classic=cache_classic,
            ram_pressure=ram_pressure,
        )
        self.recorder = Recorder(self.options.exec_log)
        self._script = Script(script, script_by_id, script_file)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._abrupt = False
        self._crashed = False
        self._port: int | None = None

    # -- life cycle -------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> FakeComfy:
        """Start serving and return once the port listens; raises OSError when the port is taken."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                raise RuntimeError("FakeComfy is already running")
            self._join_finished_thread()
            port = self.options.port or self._port or 0
            ready = threading.Event()
            outcome: dict[str, Any] = {}
            thread = threading.Thread(
                target=self._thread_main, args=(port, ready, outcome), name="fake-comfy", daemon=True
            )
            self._abrupt = self._crashed = False
            thread.start()
            if not ready.wait(timeout):
                raise TimeoutError(f"FakeComfy did not start within {timeout} s")
            if "error" in outcome:
                thread.join(timeout)
                raise outcome["error"]
            self._thread, self._port = thread, outcome["port"]
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and join the thread; safe to call twice, from any thread, or after a crash."""
        with self._lock:
            thread, loop, event = self._thread, self._loop, self._stop_event
            if thread is None:
                return
            if loop is not None and event is not None:
                with contextlib.suppress(RuntimeError):  # the loop already closed (after a crash)
                    loop.call_soon_threadsafe(event.set)
            thread.join(timeout)
            if thread.is_alive():
                raise TimeoutError(f"FakeComfy did not stop within {timeout} s")
            self._thread = None

    def restart(self, timeout: float = 10.0) -> FakeComfy:
        """Stop (if running) and start a fresh server on the same port, as a supervisor would."""
        self.stop(timeout)
        return self.start(timeout)

    def crash(self) -> None:
        """Stop abruptly, from outside, as the "crash" word does from inside (a killed server)."""
        loop, event = self._loop, self._stop_event
        if loop is None or event is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._crash_now)
        thread = self._thread
        if thread is not None:
            thread.join(10.0)

    def __enter__(self) -> FakeComfy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _join_finished_thread(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _thread_main(self, port: int, ready: threading.Event, outcome: dict[str, Any]) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve(port, ready, outcome))
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            self._loop = None
            loop.close()

    async def _serve(self, port: int, ready: threading.Event, outcome: dict[str, Any]) -> None:
        options = Options(**{**self.options.__dict__, "port": port})
        options.argv = [
            "main.py",
            "--listen",
            options.listen,
            "--port",
            str(port),
            "--base-directory",
            str(options.base_directory),
        ] + (["--cpu"] if options.cpu else [])
        server = FakeServer(options, recorder=self.recorder, script=self._script, crash=self._crash_now)
        self.options = options  # the live knobs are this server's
        try:
            outcome["port"] = await server.start()
        except BaseException as exc:
            with contextlib.suppress(Exception):
                await server.stop()
            outcome["error"] = exc
            ready.set()
            return
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        ready.set()
        await self._stop_event.wait()
        await server.stop(abrupt=self._abrupt)
        self._stop_event = None

    def _crash_now(self) -> None:
        """In the loop thread: the crash action (see the module docstring)."""
        self._abrupt = self._crashed = True
        if self._stop_event is not None:
            self._stop_event.set()

    # -- what tests read and set ------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("FakeComfy has not been started")
        return self._port

    @property
    def host(self) -> str:
        return self.options.listen.split(",")[0]

    @property
    def url(self) -> str:
        """http://host:port, for requests."""
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        """ws://host:port/ws, for websocket clients (add ?clientId=...)."""
        return f"ws://{self.host}:{self.port}/ws"

    @property
    def base_directory(self) -> Path:
        return Path(self.options.base_directory)

    @property
    def output_directory(self) -> Path:
        return self.options.output_dir

    @property
    def input_directory(self) -> Path:
        return self.options.input_dir

    @property
    def temp_directory(self) -> Path:
        return self.options.temp_dir

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and not self._crashed

    @property
    def crashed(self) -> bool:
        """True after a crash (scripted or `crash()`), until the next `start()`."""
        return self._crashed

    def stats(self) -> dict[str, Any]:
        """What GET /fake/stats answers (see stats.Recorder for the shape)."""
        return self.recorder.snapshot()

    def script(self, words: Sequence[str]) -> None:
        """Words for the next prompts in order of arrival (then ok); replaces earlier ones."""
        self._script.set_order(words)

    def script_by_id(self, mapping: Mapping[str, Sequence[str]]) -> None:
        """Words per prompt id, one per time it is posted (then ok); replaces earlier ones."""
        self._script.set_by_id(mapping)

    @property
    def node_ms(self) -> float:
        return self.options.node_ms

    @node_ms.setter
    def node_ms(self, value: float) -> None:
        self.options.node_ms = float(value)

    @property
    def load_ms(self) -> float:
        return self.options.load_ms

    @load_ms.setter
    def load_ms(self, value: float) -> None:
        self.options.load_ms = float(value)

    @property
    def history_delay_ms(self) -> float:
        """The gap between execution_success and the history write (widen it to test that race)."""
        return self.options.history_delay_ms

    @history_delay_ms.setter
    def history_delay_ms(self, value: float) -> None:
        self.options.history_delay_ms = float(value)

    @property
    def hostile_seed(self) -> int | None:
        """Hostile mode by chance: prompts scripted ok get a random mutation (None: off); live."""
        return self.options.hostile_seed

    @hostile_seed.setter
    def hostile_seed(self, value: int | None) -> None:
        self.options.hostile_seed = value

    @property
    def hostile_rate(self) -> float:
        """The share of those prompts that get one (0..1); live."""
        return self.options.hostile_rate

    @hostile_rate.setter
    def hostile_rate(self, value: float) -> None:
        self.options.hostile_rate = float(value)
