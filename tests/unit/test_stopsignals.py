"""A stop signal that reaches a forked child before its own handlers are installed is held, not the default death,
and handed to those handlers as they are installed (comfysup.stopsignals)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from comfysup import stopsignals
from comfysup.config import load_config
from comfysup.runner.loop import Runner


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    before = {sig: signal.getsignal(sig) for sig in stopsignals.STOP_SIGNALS}
    yield
    for sig, handler in before.items():
        signal.signal(sig, handler)
    stopsignals._held.clear()  # a stop held by a test and never installed must not stop the next test's runners


@pytest.mark.timeout(10)
def test_a_stop_before_install_is_handed_to_the_handler_once() -> None:
    stopsignals.hold()
    os.kill(os.getpid(), signal.SIGTERM)  # the default action would end this process here
    got: list[int] = []
    stopsignals.install(lambda signum, frame: got.append(signum))
    assert got == [signal.SIGTERM]
    stopsignals.install(lambda signum, frame: got.append(-signum))
    assert got == [signal.SIGTERM]  # handed over once, not again to a later handler
    os.kill(os.getpid(), signal.SIGINT)
    assert got == [signal.SIGTERM, -signal.SIGINT]  # from now on the handler gets them as they come


@pytest.mark.timeout(10)
def test_a_handler_for_some_signals_gets_only_those_and_an_ignored_one_is_dropped() -> None:
    stopsignals.hold()
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    got: list[int] = []
    stopsignals.install(lambda signum, frame: got.append(signum), (signal.SIGTERM,))
    stopsignals.install(signal.SIG_IGN, (signal.SIGINT,))  # as the monitor does: Ctrl-C is the supervisor's
    assert got == [signal.SIGTERM]


@pytest.mark.timeout(20)
def test_a_runner_stopped_while_its_database_does_not_answer_gives_up_instead_of_waiting(tmp_path: Path) -> None:
    """A forked runner waits for a queue that does not answer before it installs its handlers: a stop held meanwhile
    ends that wait (exit 0), rather than leave the runner looping until its supervisor kills it."""
    path = tmp_path / "config.toml"  # a PostgreSQL queue on a port where nothing listens: it does not answer
    path.write_text('[queue]\nurl = "postgresql://postgres@127.0.0.1:9/nothing"\n[comfyui]\ngpus = "cpu:1"\n')
    config = load_config(str(path), env={})
    stopsignals.hold()
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(SystemExit) as ended:
        Runner(config, "cpu0", "http://127.0.0.1:9")
    assert ended.value.code == 0
