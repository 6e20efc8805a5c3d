"""Executor.run() runs _serve in a task of its own context (c13612f, 953ecce). A cancelled
run() (the caller's task cancelled: a test harness, an embedding process) must end the same way a
stop does: its Proxmox clients closed (their thread pools), whether it was still connecting."""
from __future__ import annotations

import asyncio

import pytest

from z9.executor.worker import Executor
from tests.support import free_port, wait_until
from tests.integration.engine.test_engine_batching import _failed_connects, _settings


class _Client:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


async def test_a_run_cancelled_while_connecting_closes_its_clients(caplog: pytest.LogCaptureFixture) -> None:
    client = _Client()
    ex = Executor(_settings(f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere", 2), ["r1"],
                  client_factory=lambda r: client)  # type: ignore[arg-type,return-value]
    task = asyncio.create_task(ex.run())
    await wait_until(lambda: _failed_connects(caplog), 20, "a failed connect, waiting to retry")
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 3)
    assert client.closed == 1
