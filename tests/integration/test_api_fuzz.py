"""The API fuzzed for a few seconds (tests/api_fuzz.py; longer: bench/fuzz_api.py): random and malformed requests
and slow clients get no 5xx, always an answer, no traceback in the log, and the API's threads and memory stay
bounded. The seed is printed: a failure is replayed with COMFYSUP_FUZZ_SEED."""

from __future__ import annotations

import logging
import os
import random
import threading
from pathlib import Path

import pytest

from tests.api_fuzz import Fuzzer
from tests.api_support import api_config, running_api

SECONDS = float(os.environ.get("COMFYSUP_FUZZ_SECONDS", "8"))


@pytest.mark.timeout(90)
def test_the_api_survives_random_and_malformed_requests(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    seed = int(os.environ.get("COMFYSUP_FUZZ_SEED", random.randrange(2**32)))
    print(f"fuzz seed {seed}")
    caplog.set_level(logging.DEBUG)
    config = api_config(tmp_path, max_upload_mb=4, header_timeout_seconds=1.0, body_timeout_seconds=1.0,
                        max_connections=200, max_event_streams=50)
    with running_api(config) as url:
        before = sum(1 for t in threading.enumerate() if not t.name.startswith("fuzz-"))
        report = Fuzzer(url, seed).run(SECONDS, clients=4)
    print(dict(report.kinds), dict(report.statuses))
    assert not report.failures, f"seed {seed}: " + "\n".join(report.failures[:10])
    assert sum(report.kinds.values()) > 50 and report.kinds["multipart"] and report.kinds["json"]
    assert report.statuses[421] and report.statuses[400] and (report.statuses[200] or report.statuses[201])
    assert report.max_threads <= before + 24, (before, report.max_threads)  # not one per connection (1000s)
    assert report.max_rss_growth < 300 * 2**20, f"RSS grew by {report.max_rss_growth / 2**20:.0f} MiB"
    tracebacks = [r.getMessage() for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, f"seed {seed}: {tracebacks[:3]}"
    assert "Traceback" not in capfd.readouterr().err
