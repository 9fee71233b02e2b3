"""``comfysup run`` with [rabbitmq] url: its consumer child takes jobs from the broker, the runners run them,
their ends reach the exchanges; a killed consumer is restarted by the supervisor; status shows it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from broker_support import URL, Broker, broker  # noqa: F401
from supervisor_support import Supervised, job, wait_for

from comfysup.slotstate import read_broker_state


@pytest.mark.timeout(90)
def test_run_consumes_restarts_its_consumer_and_announces(tmp_path: Path, broker: Broker) -> None:  # noqa: F811
    results = broker.listen()
    h = Supervised(tmp_path, extra_sections={"rabbitmq": {"url": URL, "reconnect_max_delay_seconds": 1.0,
                                                          **broker.names}})
    try:
        proc = h.start()
        h.wait_ready(proc)
        wait_for(lambda: (read_broker_state(h.config) or {}).get("state") == "consuming", 20, "the consumer")
        first = read_broker_state(h.config)["pid"]  # type: ignore[index]
        jobs = [job(n) for n in range(6)]
        broker.publish([json.dumps(j).encode() for j in jobs[:3]], [j["id"] for j in jobs[:3]])
        os.kill(first, signal.SIGKILL)  # the supervisor starts another; what it held comes back
        wait_for(lambda: (read_broker_state(h.config) or {}).get("pid") not in (None, first)
                 and read_broker_state(h.config)["state"] == "consuming", 30, "a new consumer")  # type: ignore[index]
        broker.publish([json.dumps(j).encode() for j in jobs[3:]], [j["id"] for j in jobs[3:]])
        ids = {j["id"] for j in jobs}
        heard: set[str] = set()

        def all_heard() -> bool:
            heard.update(p.message_id for p, _ in broker.drain(results, timeout=0.2))
            return ids <= heard

        wait_for(all_heard, 60, "every job's end on the exchanges")
        assert {j.state for j in h.jobs(sorted(ids)).values()} == {"done"}
        status = subprocess.run([sys.executable, "-m", "comfysup", "status", "--config", str(h.config_path)],
                                capture_output=True, text=True, timeout=30)
        assert "rabbitmq consumer pid" in status.stdout and "consuming" in status.stdout
        assert "outbox backlog 0" in status.stdout
        assert h.stop(proc) == 0
        assert read_broker_state(h.config)["state"] == "stopped"  # type: ignore[index]  # SIGTERM, not a kill
    finally:
        h.cleanup()
