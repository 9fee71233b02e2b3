"""comfysup.comfy.deadline: a deadline interrupts a read that would block past it."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from comfysup.comfy import deadline
from comfysup.comfy.deadline import DeadlineExceeded

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _clean() -> None:
    deadline.reset()
    yield
    deadline.reset()


def test_a_blocking_read_is_interrupted_at_the_deadline() -> None:
    a, b = socket.socketpair()
    a.settimeout(20)  # the socket's own timeout would wait 20 s
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="the job's timeout"), deadline.within(0.3, "the job's timeout"):
        a.recv(1)
    assert 0.25 < time.monotonic() - start < 2
    a.close()
    b.close()


def test_a_trickle_is_bounded_by_the_whole_not_each_read() -> None:
    """One byte every 0.1 s never trips a per-read timeout; the deadline over the whole read does."""
    a, b = socket.socketpair()
    a.settimeout(1)
    got = 0
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded), deadline.within(0.5, "the download"):
        while True:
            b.send(b"x")
            got += len(a.recv(1))
            time.sleep(0.1)
    assert 3 <= got <= 7 and time.monotonic() - start < 2
    a.close()
    b.close()


def test_nested_deadlines_take_the_earliest_and_restore_the_outer() -> None:
    with deadline.within(5, "outer"):
        with pytest.raises(DeadlineExceeded, match="inner"), deadline.within(0.1, "inner"):
            time.sleep(3)
        assert 4 < deadline.remaining() <= 5
        with deadline.within(10, "later inner"):
            assert deadline.remaining() <= 5  # the outer one is still the first to fall
    assert deadline.remaining() == float("inf")


def test_the_outer_deadline_still_falls_after_an_inner_one_fell_or_ended_early() -> None:
    with pytest.raises(DeadlineExceeded, match="outer"), deadline.within(0.6, "outer"):
        with pytest.raises(DeadlineExceeded, match="inner"), deadline.within(0.1, "inner"):
            time.sleep(3)  # the inner one fell: the timer must be set again for the outer one
        with deadline.within(0.15, "ended early"):
            pass  # the timer stays set for it, falls early, finds nothing due and sleeps on
        time.sleep(0.2)
        time.sleep(3)


def test_a_call_inside_a_longer_deadline_sets_no_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's HTTP calls each have a bound, inside the job's: only a bound earlier than the timer's
    sets it, and an end leaves it (a system call saved each time)."""
    calls: list[float] = []
    real = signal.setitimer

    def counted(which: int, seconds: float, interval: float = 0.0) -> tuple[float, float]:
        calls.append(seconds)
        return real(which, seconds, interval)

    monkeypatch.setattr(signal, "setitimer", counted)
    with deadline.within(5, "the job"):
        armed = len(calls)
        for _ in range(10):
            with deadline.within(30, "a call"):
                pass
        assert len(calls) == armed, "a later bound inside an earlier one set the timer"
        with pytest.raises(DeadlineExceeded, match="a short call"), deadline.within(0.05, "a short call"):
            time.sleep(3)
        assert len(calls) == armed + 2, "set for the short call, then again for the job once it fell"


def test_shorten_brings_a_running_block_to_its_grace() -> None:
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="stopping"), deadline.within(30, "the job's timeout"):
        deadline.shorten(0.2, "stopping: grace_seconds passed")
        time.sleep(5)
    assert time.monotonic() - start < 2


def test_in_a_thread_deadlines_are_checked_between_reads() -> None:
    import threading

    errors: list[BaseException] = []

    def work() -> None:
        try:
            with deadline.within(0.05, "x"):
                time.sleep(0.1)  # no signal here: nothing interrupts the sleep
                deadline.check()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], DeadlineExceeded)


def test_an_earlier_timer_is_kept_and_restored() -> None:
    """pytest-timeout's own timer (or any earlier SIGALRM user) survives our deadlines."""
    import signal

    fired: list[int] = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(1))
    old = signal.setitimer(signal.ITIMER_REAL, 0.4)
    try:
        with deadline.within(5, "ours"):
            time.sleep(0.6)  # the earlier timer falls first: its handler runs, ours stays
        assert fired == [1]
        with deadline.within(0.1, "ours again"), pytest.raises(DeadlineExceeded):
            time.sleep(1)
        assert signal.getsignal(signal.SIGALRM) is not deadline._on_alarm
    finally:
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, *old)


def test_a_deferred_block_is_finished_and_the_deadline_raised_after_it() -> None:
    steps: list[str] = []
    with pytest.raises(DeadlineExceeded, match="the job"), deadline.within(0.1, "the job"):
        with deadline.deferred():
            time.sleep(0.3)  # a queue transaction: not cut
            steps.append("transaction finished")
        steps.append("not reached")
    assert steps == ["transaction finished"]


def test_suspended_lets_an_interrupt_finish_after_its_deadline() -> None:
    with pytest.raises(DeadlineExceeded), deadline.within(0.1, "the job"):
        with deadline.suspended():
            time.sleep(0.3)
            finished = True
        time.sleep(1)
    assert finished


def test_a_settled_deadline_falls_no_more_and_the_one_around_it_still_does() -> None:
    with pytest.raises(DeadlineExceeded) as outer_fell, deadline.within(0.6, "the stop"):
        with deadline.within(0.1, "the job") as job:
            deadline.settle(job)  # its caller saw it pass and acts on it
            time.sleep(0.3)
            settled_block_finished = True
        time.sleep(1)
    assert settled_block_finished and outer_fell.value.what == "the stop"


def test_a_caller_tells_its_own_deadline_from_one_around_it() -> None:
    with deadline.within(5, "the job", kind="attempt") as outer:
        try:
            with deadline.within(0.1, "GET /history", kind="call") as own:
                time.sleep(1)
        except DeadlineExceeded as exc:
            assert exc.due is own and exc.due is not outer and exc.kind == "call"
    with (pytest.raises(DeadlineExceeded) as info, deadline.within(0.1, "the job", kind="attempt") as outer,
          deadline.within(5, "GET /history")):
        time.sleep(1)
    assert info.value.due is outer and info.value.kind == "attempt"


def test_a_timer_of_ours_left_set_never_falls_to_the_handler_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deadline that ends leaves its timer set; the last one gives SIGALRM back to the handler that had it (here
    one with a timer of its own, as pytest-timeout's). Preempted right after that handler is back, the process
    must not be woken by our timer in it: the handler would take our alarm for its own (pytest-timeout failed
    a test so, and with the default action back the process would be killed)."""
    fell: list[int] = []

    def theirs(signum: int, frame: object) -> None:
        fell.append(signum)

    previous = signal.signal(signal.SIGALRM, theirs)
    old = signal.setitimer(signal.ITIMER_REAL, 60)  # their own timer, far off
    swap = signal.signal

    def swap_then_pause(signum: int, handler: object) -> object:
        before = swap(signum, handler)
        if handler is theirs:
            time.sleep(0.2)  # preempted right after the handler is theirs again
        return before

    try:
        monkeypatch.setattr(signal, "signal", swap_then_pause)
        with deadline.within(0.05, "GET /queue"):
            pass  # ends at once: our timer, set for 50 ms from now, is left to fall
        monkeypatch.undo()
        assert signal.getsignal(signal.SIGALRM) is theirs
        assert 30 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60  # theirs, with what was left of it
        assert fell == []
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, *old)


def test_calls_inside_a_suspended_block_keep_their_own_bound_but_not_a_stops() -> None:
    with deadline.within(30, "the job"):
        deadline.shorten(0.0, "a stop")  # the stop's grace is over
        with deadline.suspended():
            with deadline.within(5, "POST /interrupt"):
                time.sleep(0.2)  # not cut by the stop: the interrupt must be sent
            with pytest.raises(DeadlineExceeded, match="POST /interrupt"), deadline.within(0.1, "POST /interrupt"):
                time.sleep(1)
        with pytest.raises(DeadlineExceeded, match="a stop"):
            time.sleep(1)  # the stop comes back after the block


def test_a_forked_child_sets_its_own_timer() -> None:
    """fork does not pass the timer on: a child forked inside a deadline must set the timer itself, even for a
    bound later than the one its parent's timer was set for."""
    import os

    with deadline.within(0.5, "the parent's"):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                with deadline.within(2.0, "the child's"):
                    time.sleep(3)  # the parent's bound, inherited, falls at 0.5 s: only if the child set a timer
            except DeadlineExceeded:
                code = 0
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)  # the parent's block has ended
    assert os.WEXITSTATUS(status) == 0, "no deadline fell in the child"


def test_where_sigalrm_had_its_default_action_a_runner_keeps_the_handler_between_deadlines(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A runner's process (SIGALRM at its default action, no timer): the handler and the timer stay between two
    jobs' deadlines, so the next one arms without a system call; a timer left to fall with nothing due is
    harmless (with the default action back it would kill the process), and reset() gives the signal back."""
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    old = signal.setitimer(signal.ITIMER_REAL, 0)
    deadline.reset()
    try:
        with deadline.within(0.3, "a supervisor's call"):  # a process that did not ask to keep it gives it back
            pass
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
        deadline.keep_between()
        with deadline.within(0.3, "the first job"):
            pass
        assert signal.getsignal(signal.SIGALRM) is deadline._on_alarm
        calls: list[float] = []
        setitimer = signal.setitimer
        monkeypatch.setattr(signal, "setitimer", lambda which, seconds, *a: calls.append(seconds) or
                            setitimer(which, seconds, *a))
        with deadline.within(5, "the next job"):
            pass
        assert calls == []  # the timer set for the first falls first: no call to arm the next
        time.sleep(0.5)  # it falls with nothing due: the process lives on
        with deadline.within(0.1, "a late one"), pytest.raises(DeadlineExceeded):
            time.sleep(1)
        deadline.reset()
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
    finally:
        deadline.reset()
        signal.signal(signal.SIGALRM, previous)
        signal.setitimer(signal.ITIMER_REAL, *old)


def test_a_process_that_keeps_the_handler_gives_it_back_before_the_interpreter_exits(tmp_path) -> None:
    """A timer left armed between deadlines must not fall once the interpreter has given SIGALRM its default
    action back at exit (it would kill the process, exit -14: a supervisor's stop was seen so). Here an exit
    handler registered first (so it runs last) does what the interpreter's shutdown does, then waits past the
    timer: the process still exits 0, because keep_between's own handler disarmed it before."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import atexit, signal, time\n"
            "atexit.register(lambda: (signal.signal(signal.SIGALRM, signal.SIG_DFL), time.sleep(0.6)))\n"
            "from comfysup.comfy import deadline\n"
            "deadline.keep_between()\n"
            "with deadline.within(0.2, 'the last job'):\n"
            "    pass\n"
            "assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # left armed, as between two jobs\n")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                          env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, (done.returncode, done.stderr)
