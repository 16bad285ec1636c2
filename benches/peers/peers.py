"""The Python half of scripts/bench-peers: the Python contenders.

    python peers.py redispy-batched --redis PORT --stream S --group G -n N
    python peers.py redispy-naive   --redis PORT --stream S --group G -n N
    python peers.py echomq --sidecar HOST:PORT --redis PORT --stream S --group G -n N

Each consumes one stream through its own group, from the group's creation (or
the subscribe that creates it) until XPENDING says nothing is pending, with a
handler that does nothing, and prints one line:
`RESULT <name> <seconds> <client cpu s> <sidecar cpu s> <redis cpu s>` —
the timed window, this process's CPU time in it (getrusage), and the CPU time
the sidecar and Redis spent in it (/proc/PID/stat of $PEERS_SIDECAR_PID and
$PEERS_REDIS_PID).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import time
from typing import Any

import redis
import redis.asyncio
from redis.utils import HIREDIS_AVAILABLE

CLK_TCK = float(os.environ.get("PEERS_CLK_TCK") or os.sysconf("SC_CLK_TCK"))


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def proc_cpu(pid: str | None) -> float:
    """User+system CPU seconds of a process, from /proc/PID/stat."""
    if not pid:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 1 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Window:
    """The timed window: wall time and the CPU time of the three processes."""

    def __init__(self) -> None:
        self.sidecar = os.environ.get("PEERS_SIDECAR_PID")
        self.redis = os.environ.get("PEERS_REDIS_PID")

    def __enter__(self) -> Window:
        self.cpu0 = (self_cpu(), proc_cpu(self.sidecar), proc_cpu(self.redis))
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.took = time.perf_counter() - self.t0
        cpu1 = (self_cpu(), proc_cpu(self.sidecar), proc_cpu(self.redis))
        self.cpu = tuple(b - a for a, b in zip(self.cpu0, cpu1))

    def report(self, name: str) -> None:
        client, sidecar, redis_cpu = self.cpu
        print(f"RESULT {name} {self.took:.6f} {client:.3f} {sidecar:.3f} {redis_cpu:.3f}", flush=True)


def none_pending(r: redis.Redis, stream: str, group: str) -> bool:
    return int(r.xpending(stream, group)["pending"]) == 0


def redispy(args: argparse.Namespace, count: int) -> None:
    """XREADGROUP COUNT `count` BLOCK 2000, then one XACK with every id of the read."""
    r = redis.Redis(port=args.redis)
    r.ping()
    seen = 0
    with Window() as w:
        r.xgroup_create(args.stream, args.group, id="0")
        while seen < args.n:
            reply = r.xreadgroup(args.group, "c1", {args.stream: ">"}, count=count, block=2000)
            for _stream, entries in reply:
                ids = [entry_id for entry_id, _fields in entries]  # the handler: nothing to do
                if ids:
                    r.xack(args.stream, args.group, *ids)
                seen += len(ids)
        if not none_pending(r, args.stream, args.group):
            raise SystemExit("entries still pending")
    w.report(args.contender)


def redispy_naive(args: argparse.Namespace) -> None:
    """One entry at a time: XREADGROUP COUNT 1, then XACK of that entry."""
    r = redis.Redis(port=args.redis)
    r.ping()
    with Window() as w:
        r.xgroup_create(args.stream, args.group, id="0")
        for _ in range(args.n):
            reply = r.xreadgroup(args.group, "c1", {args.stream: ">"}, count=1, block=2000)
            entry_id = reply[0][1][0][0]
            r.xack(args.stream, args.group, entry_id)
        if not none_pending(r, args.stream, args.group):
            raise SystemExit("entries still pending")
    w.report(args.contender)


async def echomq_client(args: argparse.Namespace) -> None:
    """Our Python client through the sidecar with its defaults (max_in_flight
    unset: the sidecar's adaptive window, 64 handler workers, max_batch 256), or
    with max_in_flight fixed when --max-in-flight is given."""
    from echomq import Consumer, Delivery, FlowControl, Start

    r = redis.asyncio.Redis(port=args.redis)
    await r.ping()
    seen = 0
    all_handled = asyncio.Event()

    async def handle(_delivery: Delivery) -> None:
        nonlocal seen
        seen += 1
        if seen == args.n:
            all_handled.set()

    consumer = Consumer(
        args.sidecar,
        args.stream,
        args.group,
        handle,
        start=Start.BEGINNING,
        flow_control=FlowControl(max_in_flight=args.max_in_flight or None),
    )
    with Window() as w:
        await consumer.start()
        await all_handled.wait()
        # The last coalesced acks go out within ack_linger.
        deadline = time.monotonic() + 30
        while int((await r.xpending(args.stream, args.group))["pending"]) != 0:
            if time.monotonic() > deadline:
                raise SystemExit("entries still pending")
            await asyncio.sleep(0.0002)
    w.report(args.contender)
    await consumer.stop()
    await r.aclose()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("contender", choices=["redispy-batched", "redispy-naive", "echomq"])
    p.add_argument("--redis", type=int, required=True, help="redis port on 127.0.0.1")
    p.add_argument("--sidecar", default="")
    p.add_argument("--stream", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("-n", type=int, default=100_000)
    p.add_argument("--max-in-flight", type=int, default=0, help="echomq: 0 (default) leaves it unset")
    args = p.parse_args()
    if args.contender.startswith("redispy") and not HIREDIS_AVAILABLE:
        sys.exit("hiredis is not installed: redis-py would use its pure-Python parser")
    if args.contender == "redispy-batched":
        redispy(args, 100)
    elif args.contender == "redispy-naive":
        redispy_naive(args)
    else:
        args.contender = f"echomq-py-{args.max_in_flight}" if args.max_in_flight else "echomq-py"
        asyncio.run(echomq_client(args))


if __name__ == "__main__":
    main()
