"""Shared pytest fixtures. Each section belongs to the part of the project named in its heading."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# ==== fake_comfy fixtures (owned by fake_comfy; see tests/acceptance/test_fake_comfy.py) ===========================

if TYPE_CHECKING:
    from rabbitmq_node import OwnBroker
    from s3_support import SeaweedS3
    from supervisor_support import Supervised

    from fake_comfy import FakeComfy


os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
"""The commands and servers the tests start (hundreds of ``python -m comfysup ...``) cache their bytecode, as an
installed comfysup does (pip compiles it at install). With PYTHONDONTWRITEBYTECODE set, as on this project's
machines, each of them compiled again every module it imports: 2.30 -> 1.72 s for tests/acceptance/test_commands.py
and test_no_config.py (2026-12-04). Compiled files are written atomically, so xdist's workers may share them."""

COMFYUI_VERSIONS = ("0.3.64", "0.38")
"""The ComfyUI versions fake_comfy answers as (fake_comfy/v038.py)."""
os.environ.setdefault("FAKE_COMFY_VERSION", "0.3.64")
"""Every test meets a 0.3.64 fake unless it asks for `comfyui_version` (or the run sets FAKE_COMFY_VERSION=0.38,
which turns the whole suite to the newer one). The fake itself defaults to 0.38 outside the tests."""


@pytest.fixture(params=COMFYUI_VERSIONS)
def comfyui_version(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test once per ComfyUI version: every fake it starts, in process or launched by a supervisor
    (which passes its environment on), answers as that version. Used by the runner's tests and the chaos
    suite's fast subset (``pytestmark = pytest.mark.usefixtures("comfyui_version")``)."""
    monkeypatch.setenv("FAKE_COMFY_VERSION", request.param)
    return str(request.param)


@pytest.fixture
def fake_comfy(tmp_path: Path) -> Iterator[FakeComfy]:
    """A started FakeComfy in tmp_path/fake_comfy (node_ms=5), stopped after the test.

    Script it with .script([...]) / .script_by_id({...}), read .stats(). Imported lazily so that tests
    which never use it run without aiohttp.
    """
    from fake_comfy import FakeComfy

    with FakeComfy(base_directory=tmp_path / "fake_comfy", node_ms=5) as server:
        yield server


# ==== end of fake_comfy fixtures ========================================================================


# ==== the runner's deadlines (comfysup.comfy.deadline) ===================================================
@pytest.fixture(autouse=True)
def _no_deadline_left_over() -> Iterator[None]:
    """A runner run in a test's own thread may leave a stop's deadline behind (its SIGTERM handler sets one):
    it must not reach the next test, nor keep SIGALRM from pytest-timeout."""
    yield
    from comfysup.comfy import deadline

    deadline.reset()


# ==== logging (comfysup.logs) ===============================================================================
@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """A test that runs a command in process calls setup_logging, whose handler writes to the sys.stderr of that
    moment: pytest's capture of that test, closed after it. Left in place, a later test in the same worker (any
    order under xdist) logged into a closed file ("--- Logging error ---" with a traceback). Each test gets the
    loggers back as they were."""
    import logging

    names = ("comfysup", "py.warnings")
    kept = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).level, logging.getLogger(n).propagate)
            for n in names}
    yield
    for name, (handlers, level, propagate) in kept.items():
        logger = logging.getLogger(name)
        logger.handlers[:] = handlers
        logger.setLevel(level)
        logger.propagate = propagate


# ==== signal handlers (comfysup.stopsignals) ===================================================================
@pytest.fixture(autouse=True)
def _signals_as_they_were() -> Iterator[None]:
    """A test that runs a runner, the monitor or the supervisor in its own process installs their stop handlers;
    the monitor ignores SIGINT (Ctrl-C is the supervisor's). Left in place, every process a later test of that
    worker starts inherits SIGINT ignored, and Python then never raises KeyboardInterrupt in it: `status --watch`
    ignored its Ctrl-C under xdist. Each test gets the handlers back as they were, and no stop held for it."""
    import signal

    from comfysup import stopsignals

    kept = {sig: signal.getsignal(sig) for sig in (*stopsignals.STOP_SIGNALS, signal.SIGINT)}
    yield
    for sig, handler in kept.items():
        if handler is not None:
            signal.signal(sig, handler)
    stopsignals._held.clear()


# ==== comfysup run as a subprocess (tests/supervisor_support.py) ==========================================
@pytest.fixture
def harness(tmp_path: Path) -> Iterator[list[Supervised]]:
    """Supervised installations a test made; each is cleaned up (its processes killed, its folder kept for
    pytest) after the test, whatever happened."""
    made: list[Supervised] = []
    yield made
    for h in made:
        h.cleanup()


# ==== a private RabbitMQ node (tests/rabbitmq_node.py), for the tests that stop or cut their broker ============
@pytest.fixture(scope="session")
def _own_broker_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnBroker]:
    """Started once per session, on first use (about 4 s), and halted at its end."""
    from rabbitmq_node import OwnBroker

    node = OwnBroker(tmp_path_factory.mktemp("rabbitmq"))
    if node.bin is None:
        pytest.skip("RabbitMQ is not installed (no rabbitmq-server): install the rabbitmq-server package")
    with node:
        yield node


@pytest.fixture
def own_broker(_own_broker_node: OwnBroker) -> OwnBroker:
    """A private RabbitMQ node (own ports, data folder and cookie), shared by the tests of a session, its app
    running when each test begins: restart it, close its connections, never the machine's broker."""
    node = _own_broker_node
    if not node.answers():  # an earlier test left it stopped (stop_app): start its app again
        node.ctl("start_app")
        deadline = time.monotonic() + node.start_seconds
        while not node.answers():
            assert time.monotonic() < deadline, f"the test's RabbitMQ node {node.node} does not answer again"
            time.sleep(0.25)
    return node


# ==== end of the private RabbitMQ node ======================================================================


# ==== a real S3 server (tests/s3_support.py), for the object-storage tests =========================
@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """SeaweedFS started once per session (per xdist worker), on first use (a few seconds), and stopped at its end;
    skipped where ``weed`` is not installed."""
    from s3_support import start

    node = start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def s3_server(seaweed: SeaweedS3) -> SeaweedS3:
    """The session's S3 server, running when the test begins (a test that stopped it has it started again)."""
    if seaweed.process is None or seaweed.process.poll() is not None:
        seaweed.start()
    return seaweed
# ==== end of the S3 server ===================================================================================
