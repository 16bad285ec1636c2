"""Fixtures' machinery: a real redis-server and the real echomq-sidecar, each
on free loopback ports, owned by the test session and always cleaned up.

On a failure the tail of the sidecar's log is attached to the test report
(see conftest.py), so the server's side of the story comes with it.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from echomq.v1 import consumer_service_pb2 as pb

#: The repository root (clients/python/tests → three levels up).
REPO = Path(__file__).resolve().parents[3]
#: How long a process gets to come up.
START_TIMEOUT = 30.0

_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port that was free a moment ago, never the same one twice.

    From 10000-31999, below the kernel's ephemeral range (32768 up): a port
    the kernel hands out as free may be some outgoing connection's before
    the sidecar binds it."""
    while True:
        port = random.randrange(10000, 32000)
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port


def sidecar_binary() -> Path:
    path = Path(os.environ.get("ECHOMQ_SIDECAR_BIN", REPO / "target" / "debug" / "echomq-sidecar"))
    if not path.is_file():
        raise RuntimeError(f"sidecar binary {path} is missing: run `cargo build --bin echomq-sidecar` at {REPO}")
    return path


def _stop(process: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL, timeout: float = 10.0) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class RedisServer:
    """redis-server on a free loopback port, no persistence, its own directory."""

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="echomq-py-redis-"))
        self.url = f"redis://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = open(self.dir / "redis.log", "wb")
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "/usr/bin/redis-server",
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("redis-server did not answer PING in time")

    def close(self) -> None:
        _stop(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)


class Sidecar:
    """The echomq-sidecar binary on free loopback ports (or a unix socket).

    `kill()` is SIGKILL; `start()` again reuses the same addresses, consumer
    name and arguments, as a restarted pod would.
    """

    def __init__(self, redis_url: str, consumer_name: str, args: list[str], *, unix_socket: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="echomq-py-sidecar-"))
        if unix_socket:
            self.listen = f"unix:{self.dir / 'echomq.sock'}"
        else:
            self.listen = f"127.0.0.1:{free_port()}"
        self.admin = f"127.0.0.1:{free_port()}"
        self.redis_url = redis_url
        self.consumer_name = consumer_name
        self.args = list(args)
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path = self.dir / "sidecar.log"
        self.starts = 0

    @property
    def target(self) -> str:
        """The gRPC target a client dials: `host:port` or `unix:/path`."""
        return self.listen

    def start(self) -> None:
        if self.listen.startswith("unix:"):
            Path(self.listen[5:]).unlink(missing_ok=True)
        log = open(self.log_path, "ab")
        self.starts += 1
        log.write(f"\n===== start #{self.starts} =====\n".encode())
        log.flush()
        self.process = subprocess.Popen(
            [
                str(sidecar_binary()),
                "--redis-url", self.redis_url,
                "--listen", self.listen,
                "--admin-listen", self.admin,
                "--consumer-name", self.consumer_name,
                *self.args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "ECHOMQ_LOG": os.environ.get("ECHOMQ_LOG", "info")},
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the sidecar exited at start:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://{self.admin}/readyz", timeout=1) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the sidecar was not ready in {START_TIMEOUT} s:\n{self.log_tail()}")

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no grace, no goodbye."""
        _stop(self.process, signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: the sidecar's graceful shutdown."""
        _stop(self.process, signal.SIGTERM, timeout=30.0)

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        _stop(self.process)
        shutil.rmtree(self.dir, ignore_errors=True)


class AckCounter(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    """Counts, per branded id, the Ack ids the client really sends on the wire,
    and the Release ids; records the `max_in_flight` of each `Subscribed` it
    receives, and the most deliveries one call had received and sent no
    verdict for at once."""

    def __init__(self) -> None:
        self.acks: Counter[str] = Counter()
        #: Fail messages sent.
        self.fails = 0
        #: AckEmit messages sent, by delivery id (never coalesced: one each).
        self.ack_emits: Counter[str] = Counter()
        self.released: Counter[str] = Counter()
        self.sent_max_in_flight: list[int] = []
        self.subscribed_max_in_flight: list[int] = []
        self.peak_unsettled = 0

    async def intercept_stream_stream(
        self, continuation: Callable[..., Any], client_call_details: Any, request_iterator: Any
    ) -> Any:
        # A verdict counts before it is sent and a delivery once it arrived,
        # so `unsettled` never exceeds what the sidecar holds for the call.
        unsettled = 0

        async def counted() -> AsyncIterator[pb.ConsumeRequest]:
            nonlocal unsettled
            async for request in request_iterator:
                kind = request.WhichOneof("kind")
                if kind == "ack":
                    self.acks.update(request.ack.ids)
                    unsettled -= len(request.ack.ids)
                elif kind == "fail":
                    self.fails += 1
                    unsettled -= 1
                elif kind == "ack_emit":
                    self.ack_emits[request.ack_emit.id] += 1
                    unsettled -= 1
                elif kind == "release":
                    self.released.update(request.release.ids)
                    unsettled -= len(request.release.ids)
                elif kind == "subscribe":
                    self.sent_max_in_flight.append(request.subscribe.max_in_flight)
                yield request

        call = await continuation(client_call_details, counted())

        async def received() -> AsyncIterator[pb.ConsumeResponse]:
            nonlocal unsettled
            async for response in call:
                kind = response.WhichOneof("kind")
                if kind == "subscribed":
                    self.subscribed_max_in_flight.append(response.subscribed.max_in_flight)
                elif kind in ("delivery", "batch"):
                    unsettled += 1 if kind == "delivery" else len(response.batch.deliveries)
                    self.peak_unsettled = max(self.peak_unsettled, unsettled)
                yield response

        return received()


def run_sync_consumer(consumer: Any, done: Callable[[], bool], timeout: float = 20.0) -> None:
    """Runs a blocking `echomq.sync.Consumer` on a thread until `done()` (or
    `timeout` seconds), then stops it (5 s) and joins the thread."""
    runner = threading.Thread(target=consumer.run)
    runner.start()
    try:
        deadline = time.monotonic() + timeout
        while not done() and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        consumer.stop(5)
        runner.join(10)
    assert not runner.is_alive(), "the consumer's thread did not end"
