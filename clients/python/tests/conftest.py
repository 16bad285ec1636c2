"""Session fixtures: one redis-server and one sidecar for the conformance
scenarios, started on free loopback ports and always stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from support import REPO, RedisServer, Sidecar

SCENARIOS_PATH = REPO / "tests" / "conformance" / "scenarios.json"


def load_scenarios() -> dict[str, Any]:
    return json.loads(SCENARIOS_PATH.read_text())


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis(port=redis_server.port)
    yield client
    client.close()


_sidecars: list[Sidecar] = []


@pytest.fixture(scope="session")
def sidecar(redis_server: RedisServer) -> Iterator[Sidecar]:
    """The conformance sidecar: `--consumer-name conformance-python` and the
    suite's `sidecar_args`. A scenario that kills it restarts it; if one left
    it down, the next test brings it back (see `live_sidecar`)."""
    car = Sidecar(redis_server.url, "conformance-python", load_scenarios()["sidecar_args"])
    _sidecars.append(car)
    try:
        car.start()
        yield car
    finally:
        car.close()
        _sidecars.remove(car)


@pytest.fixture
def live_sidecar(sidecar: Sidecar) -> Sidecar:
    if not sidecar.running():
        sidecar.start()
    return sidecar


@pytest.fixture
def private_sidecar(redis_server: RedisServer, request: pytest.FixtureRequest) -> Iterator[Sidecar]:
    """A sidecar of the test's own (it may kill it), same arguments as the suite."""
    car = Sidecar(redis_server.url, f"py-{request.node.name[:40]}", load_scenarios()["sidecar_args"])
    _sidecars.append(car)
    try:
        car.start()
        yield car
    finally:
        car.close()
        _sidecars.remove(car)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Attaches the running sidecars' log tails to a failed test's report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for car in _sidecars:
            report.sections.append((f"sidecar log ({car.listen})", car.log_tail()))
