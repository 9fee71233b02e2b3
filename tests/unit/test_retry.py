"""The retry decision is pure: a table of (attempt, failure) -> decision, with the randomness injected."""

import pytest

from comfysup.runner.retry import Failure, RetryPolicy, decide, execution_failure, is_oom

POLICY = RetryPolicy(attempts=4, base_delay_seconds=2.0, max_delay_seconds=60.0, jitter=True)
TRANSIENT = Failure("http_5xx", "POST /prompt 500, 500 Internal Server Error", transient=True)
PERMANENT = Failure("validation", "POST /prompt 400, prompt_outputs_failed_validation", transient=False)


@pytest.mark.parametrize(
    ("attempt", "failure", "rand", "dead", "delay", "reason"),
    [
        (1, TRANSIENT, 1.0, False, 2.0, TRANSIENT.reason),
        (2, TRANSIENT, 1.0, False, 4.0, TRANSIENT.reason),
        (3, TRANSIENT, 0.5, False, 4.0, TRANSIENT.reason),  # full jitter: half of min(60, 2*2^2)
        (3, TRANSIENT, 0.0, False, 0.0, TRANSIENT.reason),
        (4, TRANSIENT, 1.0, True, 0.0, "gave up after 4 attempts, last: " + TRANSIENT.reason),
        (9, TRANSIENT, 1.0, True, 0.0, "gave up after 9 attempts, last: " + TRANSIENT.reason),
        (1, PERMANENT, 1.0, True, 0.0, PERMANENT.reason),
    ],
)
def test_decision_table(attempt, failure, rand, dead, delay, reason):
    d = decide(POLICY, attempt, failure, rand=lambda: rand)
    assert (d.dead, d.delay_seconds, d.reason) == (dead, pytest.approx(delay), reason)


def test_backoff_is_capped():
    policy = RetryPolicy(attempts=20, base_delay_seconds=2.0, max_delay_seconds=60.0, jitter=False)
    assert [policy.backoff(n) for n in (1, 2, 3, 4, 5, 6, 7, 10)] == [2, 4, 8, 16, 32, 60, 60, 60]


def test_full_jitter_spreads_over_the_whole_range():
    import random

    rng = random.Random(7)
    delays = [POLICY.backoff(3, rng.random) for _ in range(2000)]
    assert 0 <= min(delays) < 0.2 and 7.8 < max(delays) <= 8.0


@pytest.mark.parametrize(
    ("error", "oom"),
    [
        ({"exception_type": "torch.OutOfMemoryError", "exception_message": "x"}, True),
        ({"exception_type": "torch.cuda.OutOfMemoryError", "exception_message": "x"}, True),
        ({"exception_type": "RuntimeError", "exception_message": "CUDA out of memory. Tried to allocate"}, True),
        ({"exception_type": "RuntimeError", "exception_message": "Allocation on device 0 would exceed"}, True),
        ({"exception_type": "IndexError", "exception_message": "index 3 is out of bounds"}, False),
        # the recorded CPU allocation failure is not an OOM of the kind that a retry mends
        ({"exception_type": "RuntimeError",
          "exception_message": "DefaultCPUAllocator: can't allocate memory: you tried to allocate 4398046511104"},
         False),
    ],
)
def test_oom_is_recognised_not_guessed(error, oom):
    assert is_oom(error) is oom
    assert execution_failure({**error, "node_id": "2", "node_type": "X"}).transient is oom


def test_execution_failure_reason_names_node_and_exception():
    f = execution_failure({"node_id": "2", "node_type": "ImageToMask", "exception_type": "IndexError",
                           "exception_message": "index 3 is out of bounds for dimension 3 with size 3\n"})
    assert f.reason == ("execution_error, node 2 (ImageToMask): IndexError: index 3 is out of bounds for "
                        "dimension 3 with size 3")
    assert f.kind == "execution_error"


def test_execution_failure_reason_is_one_line():
    f = execution_failure({"node_id": "2", "node_type": "KSampler", "exception_type": "torch.OutOfMemoryError",
                           "exception_message": "Allocation on device 0 would exceed allowed memory.\n"
                                                "CUDA out of memory. Tried to allocate 1.25 GiB.\nTIPS: lower it"})
    assert f.reason == ("execution_error, node 2 (KSampler): torch.OutOfMemoryError: Allocation on device 0 would "
                        "exceed allowed memory. …")
    assert f.transient
