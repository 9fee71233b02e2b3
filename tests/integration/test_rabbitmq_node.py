"""The private RabbitMQ node of the broker-fault tests (tests/rabbitmq_node.py): it starts on ports the OS
hands out, starts again on new ones when a port was taken before it bound it, takes its faults on itself only
(a connection to the machine's broker survives them), and leaves no process behind."""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest
import rabbitmq_node
from broker_support import connection_kept
from rabbitmq_node import OwnBroker, rabbitmq_bin

pytestmark = pytest.mark.skipif(rabbitmq_bin() is None, reason="RabbitMQ is not installed (rabbitmq-server)")


@pytest.mark.timeout(120)
def test_a_taken_port_means_a_new_start_and_faults_reach_only_the_own_node(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    taken = socket.create_server(("127.0.0.1", 0))  # what another process bound between our choice and the node's
    handed: list[list[int]] = []
    real = rabbitmq_node.os_ports

    def ports(count: int) -> list[int]:
        handed.append(real(count) if handed else [real(1)[0], taken.getsockname()[1]])
        return handed[-1]

    monkeypatch.setattr(rabbitmq_node, "os_ports", ports)
    with connection_kept(), OwnBroker(tmp_path / "node") as node:  # the machine's broker: left alone throughout
        assert len(node.starts) == 2 and not node.starts[0].endswith(", up"), node.starts
        assert node.dist_port != taken.getsockname()[1] and node.answers()
        assert _processes_of(node), "its processes are not told by the folder: the check at the end proves nothing"

        with pytest.raises(AssertionError, match="was closed during it"), connection_kept(node.url):
            node.ctl("close_all_connections", "test: the check sees a cut")
    taken.close()
    assert not _processes_of(node), f"the node's processes outlived stop(): {_processes_of(node)}"


def _processes_of(node: OwnBroker) -> list[str]:
    """The command lines naming the node's folder (its script, and beam.smp's ``-home``)."""
    lines = (" ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))
    return [line[:200] for line in lines if str(node.folder) in line]
