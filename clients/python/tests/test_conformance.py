"""The conformance runner: every scenario of tests/conformance/scenarios.json,
against the real sidecar and redis-server (see tests/conformance/README.md).

A scenario, step, action or expectation this runner does not know fails the
test: nothing is skipped.
"""

from __future__ import annotations

import asyncio
import base64
import random
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import redis

from conftest import load_scenarios
from echomq import (
    AckEmitError,
    AppendResult,
    Backoff,
    BatchEntry,
    Consumer,
    Delivery,
    Emit,
    EmittedEntry,
    FailKind,
    FlowControl,
    NotScheduledError,
    PermanentError,
    PoisonError,
    RpcError,
    Start,
    Streams,
    TransientError,
    VerdictError,
)
from echomq.v1 import consumer_service_pb2 as pb
from support import AckCounter, Sidecar

SUITE = load_scenarios()
LANGUAGE = "python"
GROUP = "conformance"
WAIT_TIMEOUT = 30.0
#: What the `raise` action raises for its `kind`, and the explicit `fail`
#: action's kind option (clients/CONTRACT.md, "Failure kinds").
RAISED: dict[str, Callable[[str], Exception]] = {"message": RuntimeError, "transient": TransientError, "poison": PoisonError}
FAIL_KINDS = {"message": FailKind.MESSAGE, "transient": FailKind.TRANSIENT, "poison": FailKind.POISON}
#: Reconnect quickly in tests: the suite restarts the sidecar.
RECONNECT = Backoff(initial=0.05, maximum=0.5)


def decode_value(spec: dict[str, Any]) -> bytes:
    if "utf8" in spec:
        return str(spec["utf8"]).encode()
    if "base64" in spec:
        return base64.b64decode(spec["base64"])
    if "repeat" in spec:
        return bytes([spec["repeat"]["byte"]]) * spec["repeat"]["count"]
    if spec.get("all_bytes"):
        return bytes(range(256))
    raise AssertionError(f"unknown field value spec {spec!r}")


def decode_fields(entry: dict[str, Any]) -> dict[str, bytes]:
    return {name: decode_value(value) for name, value in entry["fields"].items()}


def deliver_at(entry: dict[str, Any]) -> datetime | None:
    """An append_calls entry's `deliver_in_ms` as the instant it names."""
    if "deliver_in_ms" not in entry:
        return None
    return datetime.now(timezone.utc) + timedelta(milliseconds=entry["deliver_in_ms"])


def delay(entry: dict[str, Any]) -> timedelta | None:
    """An append_calls entry's `delay_ms`."""
    return timedelta(milliseconds=entry["delay_ms"]) if "delay_ms" in entry else None


def decode_entries(entries: list[dict[str, Any]]) -> list[dict[str, bytes]]:
    return [decode_fields(e) for e in entries]


@dataclass
class HandlerCall:
    id: str
    stream_id: str
    attempts: int
    payload: dict[str, bytes]
    started: float
    finished: float | None = None
    lease_lost_signalled: bool = False


@dataclass
class Run:
    """What one scenario observed."""

    calls: list[HandlerCall] = field(default_factory=list)
    running: int = 0
    max_running: int = 0
    verdict_errors: list[str] = field(default_factory=list)
    stop_ms: float | None = None
    appended: dict[str, dict[str, bytes]] = field(default_factory=dict)  # stream id → fields
    appended_ids: set[str] = field(default_factory=set)  # branded ids the producer's answers carried
    first_by_dedup_key: dict[str, AppendResult] = field(default_factory=dict)
    by_ref: dict[str, AppendResult] = field(default_factory=dict)  # `ref` of an append_calls entry → its answer
    scheduled_ids: set[str] = field(default_factory=set)  # branded ids answered `scheduled`
    emitted: list[EmittedEntry] = field(default_factory=list)  # what ack_emit answered, every call
    ack_emit_refusals: list[str] = field(default_factory=list)  # AckEmitError codes the handler saw
    consumer_error: BaseException | None = None  # what `wait_consumer_error` saw end the consumer

    def handled(self) -> int:
        return sum(1 for c in self.calls if c.finished is not None)

    def distinct_handled(self) -> int:
        return len({c.id for c in self.calls if c.finished is not None})


async def until(what: str, predicate: Callable[[], bool], timeout: float = WAIT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.01)


class ScenarioRunner:
    def __init__(self, scenario: dict[str, Any], sidecar: Sidecar, redis_client: redis.Redis) -> None:
        self.scenario = scenario
        self.sidecar = sidecar
        self.redis = redis_client
        self.stream = f"conf:{LANGUAGE}:{scenario['name']}"
        self.dlq = f"{self.stream}:dlq"
        self.sink = f"{self.stream}:sink"
        self.expect: dict[str, Any] = scenario.get("expect", {})
        self.run = Run()
        self.calls_by_id: Counter[str] = Counter()
        self.acks = AckCounter()
        self.consumers: list[Consumer] = []
        self.stopped: set[int] = set()
        self.producer: Streams | None = None

    # -- the handler -------------------------------------------------------------

    def action_for(self, id: str, attempts: int) -> dict[str, Any]:
        handler = self.scenario["handler"]
        calls = self.calls_by_id[id]  # this call counted already
        for key, by in (("by_call", calls), ("by_attempt", attempts)):
            action = handler.get(key, {}).get(str(by))
            if action is not None:
                return action  # type: ignore[no-any-return]
        return handler.get("default", {"action": "return"})  # type: ignore[no-any-return]

    async def handle(self, delivery: Delivery) -> None:
        call = HandlerCall(delivery.id, delivery.stream_id, delivery.attempts, dict(delivery.payload), time.monotonic())
        self.run.calls.append(call)
        self.calls_by_id[delivery.id] += 1
        self.run.running += 1
        self.run.max_running = max(self.run.max_running, self.run.running)
        try:
            action = self.action_for(delivery.id, delivery.attempts)
            kind = action["action"]
            if kind == "return":
                pass
            elif kind == "raise":
                raise RAISED[action.get("kind", "message")](action["message"])
            elif kind == "fail":
                await delivery.fail(
                    action.get("reason", ""),
                    retry_after=action["retry_after_ms"] / 1000,
                    **({"kind": FAIL_KINDS[action["kind"]]} if "kind" in action else {}),
                )
            elif kind == "dead_letter":
                await delivery.dead_letter(action.get("reason", ""))
            elif kind == "ack_emit":
                fields = {name: decode_value(value) for name, value in action["fields"].items()}
                fields["source"] = delivery.id.encode()
                try:
                    self.run.emitted.extend(await delivery.ack_emit([Emit(self.sink, fields)]))
                except AckEmitError as refused:
                    self.run.ack_emit_refusals.append(refused.code.name if refused.code else "CALL_ENDED")
                    raise  # held: the consumer fails the delivery with the refusal
            elif kind == "sleep":
                ms = action["ms"] if "ms" in action else random.randint(0, action["ms_random_max"])
                await asyncio.sleep(ms / 1000)
            elif kind == "wait_lease_lost":
                try:
                    await asyncio.wait_for(delivery.lease_lost.wait(), WAIT_TIMEOUT)
                except asyncio.TimeoutError:
                    raise AssertionError(f"the lease of {delivery.id} was never reported lost") from None
                call.lease_lost_signalled = True
                # Returning normally: the client must send no verdict now.
            elif kind == "hang":
                # A hanging handler never finishes by design; it counts as
                # handled once it hangs, so that `wait_handled` can see it.
                call.finished = time.monotonic()
                await asyncio.Event().wait()
            else:
                raise AssertionError(f"unknown handler action {kind!r}")
        finally:
            self.run.running -= 1
            if call.finished is None:
                call.finished = time.monotonic()

    def on_verdict_error(self, error: VerdictError) -> None:
        self.run.verdict_errors.append(error.code.name)

    def new_consumer(self) -> Consumer:
        settings = self.scenario["consumer"]
        consumer = Consumer(
            self.sidecar.target,
            self.stream,
            GROUP,
            self.handle,
            start=Start.BEGINNING,
            flow_control=FlowControl(max_in_flight=settings.get("max_in_flight"), concurrency=settings.get("concurrency")),
            max_deliveries=settings.get("max_deliveries"),
            key_field=settings.get("key_field"),
            max_in_flight_per_key=settings.get("max_in_flight_per_key"),
            reconnect=RECONNECT,
            on_verdict_error=self.on_verdict_error,
            interceptors=[self.acks],
        )
        self.consumers.append(consumer)
        return consumer

    # -- appends -----------------------------------------------------------------

    async def append(self, entries: list[dict[str, bytes]], *, retry: bool = False) -> None:
        assert self.producer is not None
        deadline = time.monotonic() + WAIT_TIMEOUT
        while True:
            try:
                if len(entries) == 1:
                    results = [await self.producer.append(self.stream, entries[0])]
                else:
                    results = await self.producer.append_batch(self.stream, entries)
                break
            except RpcError as error:
                if not retry or error.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        for result, fields in zip(results, entries, strict=True):
            self.run.appended[result.stream_id] = fields
            self.run.appended_ids.add(result.id)

    async def append_call(self, call: dict[str, Any]) -> None:
        """One of `append_calls`: an append or a batch whose entries may carry
        a dedup key; every answer is checked against the entry's `duplicate`."""
        assert self.producer is not None
        [(kind, spec)] = call.items()
        if kind == "append":
            specs = [spec]
            results = [
                await self.producer.append(
                    self.stream,
                    decode_fields(spec),
                    dedup_key=spec.get("dedup_key"),
                    deliver_at=deliver_at(spec),
                    delay=delay(spec),
                )
            ]
        elif kind == "append_batch":
            specs = spec
            entries = [
                BatchEntry(decode_fields(e), dedup_key=e.get("dedup_key"), deliver_at=deliver_at(e), delay=delay(e))
                for e in specs
            ]
            results = await self.producer.append_batch(self.stream, entries)
        else:
            raise AssertionError(f"unknown append call {kind!r}")
        for result, entry in zip(results, specs, strict=True):
            want_scheduled = entry.get("scheduled", False)
            assert result.scheduled == want_scheduled, f"{kind} of {entry}: scheduled {result.scheduled}, want {want_scheduled}"
            if result.scheduled:
                assert result.stream_id == "", f"a scheduled entry's answer has stream id {result.stream_id!r}"
                self.run.scheduled_ids.add(result.id)
            if "ref" in entry:
                self.run.by_ref[entry["ref"]] = result
            want = entry.get("duplicate", False)
            assert result.duplicate == want, f"{kind} of {entry}: duplicate {result.duplicate}, want {want}"
            key = entry.get("dedup_key")
            if want:
                first = self.run.first_by_dedup_key[key]
                assert (result.id, result.stream_id) == (first.id, first.stream_id), (
                    f"duplicate of {key!r} answered {result}, the first was {first}"
                )
                continue
            assert result.id not in self.run.appended_ids, f"{result.id} answered twice without duplicate"
            if key:
                self.run.first_by_dedup_key[key] = result
            self.run.appended[result.stream_id] = decode_fields(entry)
            self.run.appended_ids.add(result.id)

    # -- steps -------------------------------------------------------------------

    def default_steps(self) -> list[str]:
        n = self.expect.get("handled", self.expect.get("distinct_handled"))
        assert n is not None, "a scenario without steps needs expect.handled or expect.distinct_handled"
        return ["start_consumer", f"wait_handled:{n}"]

    def handled_for_wait(self) -> int:
        # With only `distinct_handled` expected, redeliveries are allowed (a
        # restart may redeliver an ack in flight), so count distinct ids.
        if "handled" not in self.expect and "distinct_handled" in self.expect:
            return self.run.distinct_handled()
        return self.run.handled()

    async def step(self, text: str) -> None:
        name, _, arg = text.partition(":")
        if name == "start_consumer":
            await self.new_consumer().start()
        elif name == "start_second_consumer":
            await self.new_consumer().start()
        elif name == "wait_handled":
            n = int(arg)
            await until(f"{n} handled", lambda: self.handled_for_wait() >= n)
        elif name == "wait_started":
            n = int(arg)
            await until(f"{n} started", lambda: len(self.run.calls) >= n)
        elif name == "drop_connection":
            await self.consumers[-1].abort()
            self.stopped.add(len(self.consumers) - 1)
        elif name == "stop":
            began = time.monotonic()
            await self.stop_all(int(arg) / 1000)
            self.run.stop_ms = (time.monotonic() - began) * 1000
        elif name == "stop_first":
            self.stopped.add(0)
            await self.consumers[0].stop(int(arg) / 1000)
            await self.consumers[0].wait()
        elif name == "kill_sidecar":
            self.sidecar.kill()
        elif name == "restart_sidecar":
            await asyncio.to_thread(self.sidecar.start)
        elif name == "append_after_restart":
            await self.append(decode_entries(self.scenario["append_after_restart"]), retry=True)
        elif name == "append_more":
            await self.append([{"n": str(i).encode()} for i in range(int(arg))])
        elif name == "ack_unknown":
            consumer = self.consumers[-1]
            await consumer.wait_subscribed(WAIT_TIMEOUT)
            assert await consumer.send_ack(arg), "no open call to send the raw ack on"
        elif name == "steal":
            # A peer named `thief` takes the entry whose handler started last.
            stolen = self.run.calls[-1].stream_id
            claimed = self.redis.xclaim(self.stream, GROUP, "thief", 0, [stolen])
            assert claimed, f"XCLAIM of {stolen} claimed nothing"
        elif name == "sleep":
            await asyncio.sleep(int(arg) / 1000)
        elif name == "assert_handled":
            assert len(self.run.calls) == int(arg), f"{len(self.run.calls)} handler calls so far, want {arg}"
        elif name == "assert_scheduled":
            assert self.producer is not None
            listed = [e.id async for e in self.producer.scheduled(self.stream)]
            assert len(listed) == int(arg), f"ListScheduled listed {listed}, want {arg} entries"
            assert set(listed) <= self.run.scheduled_ids, f"listed {listed}, scheduled {self.run.scheduled_ids}"
        elif name == "cancel_scheduled":
            assert self.producer is not None
            target = self.run.by_ref[arg]
            due = await self.producer.cancel_scheduled(target.stream, target.id)
            assert due > datetime.now(timezone.utc) - timedelta(seconds=1), f"cancelled {arg} was due at {due}"
            self.run.appended_ids.discard(target.id)  # never to be handled
        elif name == "cancel_scheduled_not_found":
            assert self.producer is not None
            target = self.run.by_ref[arg]
            with pytest.raises(NotScheduledError) as raised:
                await self.producer.cancel_scheduled(target.stream, target.id)
            assert raised.value.code == grpc.StatusCode.NOT_FOUND
        elif name == "wait_consumer_error":
            index = len(self.consumers) - 1
            try:
                await asyncio.wait_for(self.consumers[index].wait(), WAIT_TIMEOUT)
            except asyncio.TimeoutError:
                raise AssertionError(f"the consumer did not end by itself within {WAIT_TIMEOUT} s") from None
            except Exception as error:  # noqa: BLE001 - recorded, checked by `consumer_error`
                self.run.consumer_error = error
            else:
                raise AssertionError("the consumer ended without an error")
            self.stopped.add(index)
        elif name == "wait_verdict_error":
            await until(f"verdict error {arg}", lambda: arg in self.run.verdict_errors)
        else:
            raise AssertionError(f"unknown step {text!r}")

    async def stop_all(self, deadline: float) -> None:
        live = [i for i in range(len(self.consumers)) if i not in self.stopped]
        self.stopped.update(live)
        await asyncio.gather(*(self.consumers[i].stop(deadline) for i in live))
        for i in live:
            await self.consumers[i].wait()  # raises a consumer's permanent error

    # -- the run -----------------------------------------------------------------

    async def execute(self) -> None:
        self.redis.delete(self.stream, self.dlq, self.sink)
        self.producer = Streams(self.sidecar.target)
        try:
            if "append" in self.scenario:
                await self.append(decode_entries(self.scenario["append"]))
            for call in self.scenario.get("append_calls", []):
                await self.append_call(call)
            if "append_generated" in self.scenario:
                generated = self.scenario["append_generated"]
                await self.append([{generated["field"]: str(i).encode()} for i in range(generated["count"])])
            for text in self.scenario.get("steps") or self.default_steps():
                await self.step(text)
            await self.stop_all(10.0)
            self.check()
        finally:
            for consumer in self.consumers:
                await consumer.abort()
            await self.producer.close()

    def pending(self) -> int:
        return int(self.redis.xpending(self.stream, GROUP)["pending"])

    def check(self) -> None:
        run, expect = self.run, self.expect
        for key, want in expect.items():
            if key == "handled":
                assert len(run.calls) == want, f"handler calls: {len(run.calls)}, want {want}"
            elif key == "distinct_handled":
                got = len({c.id for c in run.calls})
                assert got == want, f"distinct ids handled: {got}, want {want}"
            elif key == "attempts":
                got = dict(Counter(c.attempts for c in run.calls))
                assert got == {int(k): v for k, v in want.items()}, f"attempts histogram {got}, want {want}"
            elif key == "min_redelivery_gap_ms":
                by_id: dict[str, list[float]] = {}
                for c in run.calls:
                    by_id.setdefault(c.id, []).append(c.started)
                gaps = [(s[1] - s[0]) * 1000 for s in by_id.values() if len(s) > 1]
                assert gaps, "no redelivery happened"
                assert min(gaps) >= want, f"redelivery gap {min(gaps):.0f} ms < {want} ms"
            elif key == "pending_after":
                got = self.pending()
                assert got == want, f"XPENDING count {got}, want {want}"
            elif key == "stream_length":
                got = self.redis.xlen(self.stream)
                assert got == want, f"XLEN {self.stream} = {got}, want {want}"
            elif key == "handled_ids_equal_appended":
                handled = {c.id for c in run.calls}
                assert (handled == run.appended_ids) == want, f"handled {handled}, appended {run.appended_ids}"
            elif key == "dead_letters":
                got = self.redis.xlen(self.dlq)
                assert got == want, f"XLEN {self.dlq} = {got}, want {want}"
            elif key == "dead_letter_fields":
                [(_, fields)] = self.redis.xrange(self.dlq)
                for name, value in want.items():
                    assert fields.get(name.encode()) == value.encode(), (
                        f"dead letter field {name!r} = {fields.get(name.encode())!r}, want {value!r}; all: {fields}"
                    )
            elif key == "dead_letter_keeps_branded_id":
                [(_, fields)] = self.redis.xrange(self.dlq)
                ids = {c.id for c in run.calls}
                assert (fields.get(b"id", b"").decode() in ids) == want, f"dead letter id {fields.get(b'id')!r}, handled {ids}"
            elif key == "each_acked_once":
                ids = {c.id for c in run.calls}
                wrong = {i: self.acks.acks[i] for i in ids if self.acks.acks[i] != 1}
                extra = set(self.acks.acks) - ids
                assert (not wrong and not extra) == want, f"ack counts off: {wrong}, acks of unhandled ids: {extra}"
            elif key == "released":
                repeated = {i: n for i, n in self.acks.released.items() if n != 1}
                assert not repeated, f"ids released more than once: {repeated}"
                got = len(self.acks.released)
                assert got == want, f"{got} ids released, want {want}"
            elif key == "payload_equals_appended":
                for c in run.calls:
                    assert (c.payload == run.appended[c.stream_id]) == want, f"payload of {c.stream_id} differs"
            elif key == "verdict_errors":
                assert run.verdict_errors == want, f"verdict errors {run.verdict_errors}, want {want}"
            elif key == "lease_lost_signalled":
                got = sum(1 for c in run.calls if c.lease_lost_signalled)
                assert got == want, f"{got} handler calls saw their lease lost, want {want}"
            elif key == "max_concurrent_handlers":
                assert run.max_running <= want, f"{run.max_running} handlers ran at once, limit {want}"
            elif key == "sent_max_in_flight":
                sent = self.acks.sent_max_in_flight
                assert sent and all(m == want for m in sent), f"Subscribe carried {sent}, want {want}"
            elif key == "subscribed_max_in_flight":
                got = self.acks.subscribed_max_in_flight
                assert got and all(m == want for m in got), f"Subscribed reported {got}, want {want}"
            elif key == "peak_unsettled_at_least":
                peak = self.acks.peak_unsettled
                assert peak >= want, f"at most {peak} deliveries were un-settled at once, want at least {want}"
            elif key == "stop_returned_within_ms":
                assert run.stop_ms is not None, "the scenario has no stop step"
                assert run.stop_ms <= want, f"stop took {run.stop_ms:.0f} ms, limit {want}"
            elif key == "sink_length":
                got = self.redis.xlen(self.sink)
                assert got == want, f"XLEN {self.sink} = {got}, want {want}"
            elif key == "sink_sources_equal_appended":
                sources = [f[b"source"].decode() for _, f in self.redis.xrange(self.sink)]
                got = len(sources) == len(set(sources)) and set(sources) == run.appended_ids
                assert got == want, f"sink sources {sources}, appended {run.appended_ids}"
            elif key == "emitted_equal_sink":
                sink = sorted((f[b"id"].decode(), i.decode(), self.sink) for i, f in self.redis.xrange(self.sink))
                emitted = sorted((e.id, e.stream_id, e.stream) for e in run.emitted)
                assert (emitted == sink) == want, f"emitted {emitted}, sink {sink}"
            elif key == "ack_emit_refusals":
                assert run.ack_emit_refusals == want, f"ack_emit refusals {run.ack_emit_refusals}, want {want}"
            elif key == "ack_emits_sent":
                got = sum(self.acks.ack_emits.values())
                assert got == want, f"{got} AckEmit messages sent, want {want}"
            elif key == "acks_sent":
                got = sum(self.acks.acks.values())
                assert got == want, f"{got} ids sent in Ack messages, want {want}"
            elif key == "per_key_serial":
                check_per_key_serial(run.calls, want["key_field"], want["seq_field"])
            elif key == "max_concurrent_keys_at_least":
                got = max_concurrent_keys(run.calls, expect["per_key_serial"]["key_field"])
                assert got >= want, f"calls of at most {got} keys ran at once, want at least {want}"
            elif key == "consumer_error":
                error = run.consumer_error
                assert isinstance(error, PermanentError), f"the consumer ended with {error!r}, want a PermanentError"
                assert error.code.name == want["code"], f"code {error.code.name}, want {want['code']}: {error}"
                assert want["message_contains"] in str(error), f"{str(error)!r} does not name {want['message_contains']!r}"
                assert want["message_contains"] in error.details, f"details {error.details!r}"
            else:
                raise AssertionError(f"unknown expectation {key!r}")


def keyed_calls(calls: list[HandlerCall], key_field: str) -> dict[bytes, list[HandlerCall]]:
    """The handler calls of entries with `key_field`, by its value, in the order they started."""
    by_key: dict[bytes, list[HandlerCall]] = {}
    for c in sorted(calls, key=lambda c: c.started):
        if key_field in c.payload:
            by_key.setdefault(c.payload[key_field], []).append(c)
    return by_key


def check_per_key_serial(calls: list[HandlerCall], key_field: str, seq_field: str) -> None:
    """Within a key no two calls overlap, and their seq values never decrease."""
    by_key = keyed_calls(calls, key_field)
    assert by_key, f"no handler call had the field {key_field!r}"
    for key, runs in by_key.items():
        for before, after in zip(runs, runs[1:]):
            assert before.finished is not None and after.started >= before.finished, (
                f"key {key!r}: {after.stream_id} started {(before.finished or 0) - after.started:.3f} s "
                f"before {before.stream_id} finished"
            )
        seqs = [int(c.payload[seq_field]) for c in runs]
        assert seqs == sorted(seqs), f"key {key!r}: seq in start order {seqs}"


def max_concurrent_keys(calls: list[HandlerCall], key_field: str) -> int:
    """The most distinct keys with calls running at the start of some call."""
    keyed = [c for c in calls if key_field in c.payload and c.finished is not None]
    return max(
        (len({o.payload[key_field] for o in keyed if o.started <= c.started < (o.finished or 0)}) for c in keyed),
        default=0,
    )


@pytest.mark.parametrize("scenario", SUITE["scenarios"], ids=[s["name"] for s in SUITE["scenarios"]])
async def test_conformance(scenario: dict[str, Any], live_sidecar: Sidecar, redis_client: redis.Redis) -> None:
    await ScenarioRunner(scenario, live_sidecar, redis_client).execute()
