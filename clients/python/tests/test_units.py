"""Unit tests of the pieces that need no sidecar."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import grpc
import pytest

from echomq import (
    Backoff,
    Consumer,
    DeadLetter,
    EchoMQError,
    Fail,
    FailKind,
    FlowControl,
    PermanentError,
    PoisonError,
    RpcError,
    Start,
    StartKind,
    TransientError,
    VerdictErrorCode,
)
from echomq.consumer import _apply, _Call, _fail_unsettled, _Ready, _Stopping
from echomq.delivery import AckEmitError, Delivery, VerdictError, fail_kind_of
from echomq.errors import from_rpc_error
from echomq.options import to_duration
from echomq._appends import AppendResult, BatchEntry, append_batch_request, append_request, appended, encode_fields
from echomq.v1 import stream_service_pb2 as stream_pb
from echomq.v1 import consumer_service_pb2 as pb


async def _noop(delivery: Delivery) -> None:
    pass


def test_backoff_is_jittered_exponential_and_capped() -> None:
    backoff = Backoff(initial=0.1, maximum=2.0, multiplier=2.0)
    rng = random.Random(7)
    for failures, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (5, 2.0), (50, 2.0)]:
        delays = [backoff.delay(failures, rng) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert max(delays) - min(delays) > ceiling / 10  # jittered, not constant


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        Backoff(initial=0)
    with pytest.raises(ValueError):
        Backoff(initial=2, maximum=1)


def test_durations_convert_seconds_and_timedeltas() -> None:
    assert to_duration(1.5) == to_duration(timedelta(milliseconds=1500))
    d = to_duration(0.3)
    assert (d.seconds, d.nanos) == (0, 300_000_000)


def test_start_has_no_default_and_fills_the_subscribe() -> None:
    with pytest.raises(TypeError):
        Consumer("127.0.0.1:1", "s", "g", _noop, start=None)  # type: ignore[arg-type]
    for start, kind in [(Start.NEW, pb.GROUP_START_NEW), (Start.BEGINNING, pb.GROUP_START_BEGINNING)]:
        sub = pb.Subscribe()
        start.apply(sub)
        assert sub.group_start == kind
    sub = pb.Subscribe()
    Start.after("1718000000000-3").apply(sub)
    assert (sub.group_start, sub.start_id) == (pb.GROUP_START_ID, "1718000000000-3")
    sub = pb.Subscribe()
    Start.at(datetime(2024, 6, 10, tzinfo=timezone.utc)).apply(sub)
    assert sub.group_start == pb.GROUP_START_INSTANT and sub.start_time.seconds == 1717977600
    assert Start.at(datetime(2024, 6, 10)).kind is StartKind.INSTANT


def test_concurrency_is_bounded_by_max_in_flight() -> None:
    with pytest.raises(ValueError):
        Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW, max_in_flight=4, concurrency=5)
    assert Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW, max_in_flight=4).concurrency == 4


def test_handler_concurrency_defaults_to_64_not_the_adaptive_cap() -> None:
    from echomq import sync as echomq_sync
    from echomq.consumer import DEFAULT_CONCURRENCY, DEFAULT_MAX_IN_FLIGHT

    assert (DEFAULT_CONCURRENCY, DEFAULT_MAX_IN_FLIGHT) == (64, 1024)  # clients/CONTRACT.md
    # Unset: sized when the sidecar reports its cap (min(64, cap), test_whole.py).
    assert Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW).concurrency is None
    assert Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW, flow_control=FlowControl(2000)).concurrency == 2000
    unset = echomq_sync.Consumer("127.0.0.1:1", "s", "g", lambda d: None, start=Start.NEW)
    assert unset._pool._max_workers == 64  # not a thread per slot of the cap (1024)
    fixed = echomq_sync.Consumer("127.0.0.1:1", "s", "g", lambda d: None, start=Start.NEW, flow_control=FlowControl(200))
    assert fixed._pool._max_workers == 200


class _FakeError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "what to fix"


#: clients/CONTRACT.md, "Permanent status codes": the same set in all four clients.
CONTRACT_PERMANENT = [
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.UNIMPLEMENTED,
]


def test_the_permanent_codes_are_the_contracts_set() -> None:
    from echomq.errors import PERMANENT_CODES

    assert PERMANENT_CODES == frozenset(CONTRACT_PERMANENT)


@pytest.mark.parametrize("code", CONTRACT_PERMANENT)
def test_permanent_codes_map_to_permanent_error(code: grpc.StatusCode) -> None:
    error = from_rpc_error("Consume", _FakeError(code))
    assert isinstance(error, PermanentError) and error.permanent
    assert "what to fix" in str(error) and code.name in str(error)


@pytest.mark.parametrize(
    "code",
    [
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
    ],
)
def test_transient_codes_are_retryable(code: grpc.StatusCode) -> None:
    error = from_rpc_error("Consume", _FakeError(code))
    assert type(error) is RpcError and not error.permanent


def test_field_values_accept_text_and_bytes() -> None:
    assert encode_fields({"a": "é", "b": b"\xff", "c": bytearray(b"x")}) == {"a": "é".encode(), "b": b"\xff", "c": b"x"}


def test_dedup_keys_go_on_the_wire_and_none_means_no_key() -> None:
    assert append_request("s", {"a": "1"}, 0, dedup_key="k").dedup_key == "k"
    assert append_request("s", {"a": "1"}, 0).dedup_key == ""
    batch = append_batch_request("s", [BatchEntry({"a": "1"}, dedup_key="k"), {"a": "2"}, BatchEntry({"a": "3"})], 0)
    assert [e.dedup_key for e in batch.entries] == ["k", "", ""]
    assert [dict(e.fields) for e in batch.entries] == [{"a": b"1"}, {"a": b"2"}, {"a": b"3"}]
    assert appended(stream_pb.AppendResponse(id="i", stream_id="1-0", stream="s", duplicate=True)).duplicate
    assert AppendResult("i", "1-0").duplicate is False


def test_unknown_verdict_error_codes_do_not_crash() -> None:
    assert VerdictErrorCode.of(99) is VerdictErrorCode.UNSPECIFIED
    error = VerdictError.from_proto(pb.VerdictError(id="x", code=pb.VERDICT_ERROR_CODE_UNKNOWN_ID, message="m"))
    assert error.code is VerdictErrorCode.UNKNOWN_ID


def _delivery(call: _Call, id: str = "01" * 14) -> Delivery:
    message = pb.Delivery(id=id, stream_id="1-0", stream="s", group="g", attempts=1)
    message.payload["k"] = b"v"
    return Delivery.from_proto(message, call)


async def _drain(call: _Call) -> list[pb.ConsumeRequest]:
    call.finish()
    return [m async for m in call.requests(pb.ConsumeRequest())][1:]


async def test_a_delivery_is_settled_once() -> None:
    call = _Call()
    delivery = _delivery(call)
    assert await delivery.fail("nope", retry_after=0.25)
    assert not await delivery.ack()
    assert delivery.settled
    [sent] = await _drain(call)
    assert sent.fail.id == delivery.id and sent.fail.reason == "nope" and sent.fail.retry_after.nanos == 250_000_000


async def test_an_explicit_fail_sends_its_kind_and_message_unless_told() -> None:
    call = _Call()
    plain, transient, poison = (_delivery(call, f"{i:028x}") for i in range(3))
    await plain.fail("bad row")
    await transient.fail("db down", retry_after=0.5, kind=FailKind.TRANSIENT)
    await poison.fail("cannot parse", kind=FailKind.POISON)
    sent = [m.fail for m in await _drain(call)]
    assert [(f.id, f.kind, f.dead_letter) for f in sent] == [
        (plain.id, pb.FAIL_KIND_MESSAGE, False),
        (transient.id, pb.FAIL_KIND_TRANSIENT, False),
        (poison.id, pb.FAIL_KIND_POISON, False),
    ]
    assert sent[1].retry_after.nanos == 500_000_000 and sent[2].reason == "cannot parse"


async def test_dead_letter_is_a_poison_fail_that_an_older_sidecar_also_understands() -> None:
    call = _Call()
    delivery = _delivery(call)
    await delivery.dead_letter("bad")
    [sent] = await _drain(call)
    assert sent.fail.kind == pb.FAIL_KIND_POISON and sent.fail.dead_letter and sent.fail.reason == "bad"


def test_a_handlers_exception_type_says_the_kind() -> None:
    assert fail_kind_of(TransientError("db down")) is FailKind.TRANSIENT
    assert fail_kind_of(PoisonError("cannot parse")) is FailKind.POISON
    assert fail_kind_of(ValueError("bad row")) is FailKind.MESSAGE
    assert issubclass(TransientError, EchoMQError) and issubclass(PoisonError, EchoMQError), "one error family"


async def test_a_batch_handlers_verdicts_and_exceptions_send_their_kind() -> None:
    call = _Call()
    batch = [_delivery(call, f"{i:028x}") for i in range(6)]
    verdicts = [
        Fail("later", kind=FailKind.TRANSIENT),
        Fail("bad row"),
        TransientError("db down"),
        PoisonError("cannot parse"),
        DeadLetter("rule broken"),
    ]
    for delivery, verdict in zip(batch, verdicts):
        await _apply(delivery, verdict)
    await _fail_unsettled(batch, "the whole batch: db down", FailKind.TRANSIENT)
    sent = [m.fail for m in await _drain(call)]
    assert [(f.reason, f.kind, f.dead_letter) for f in sent] == [
        ("later", pb.FAIL_KIND_TRANSIENT, False),
        ("bad row", pb.FAIL_KIND_MESSAGE, False),
        ("db down", pb.FAIL_KIND_TRANSIENT, False),
        ("cannot parse", pb.FAIL_KIND_POISON, False),
        ("rule broken", pb.FAIL_KIND_POISON, True),
        ("the whole batch: db down", pb.FAIL_KIND_TRANSIENT, False),
    ]


async def test_a_fail_kind_must_be_a_fail_kind() -> None:
    delivery = _delivery(_Call())
    with pytest.raises(TypeError, match="FailKind"):
        await delivery.fail("x", kind="transient")  # type: ignore[arg-type]


async def test_verdicts_for_an_ended_call_are_dropped() -> None:
    call = _Call()
    delivery = _delivery(call)
    call.end()
    assert not await delivery.ack()
    drained = [m async for m in call.requests(pb.ConsumeRequest())]
    assert drained == [pb.ConsumeRequest()], "only the subscribe: no verdict was queued"


async def test_an_ended_call_stops_its_request_stream() -> None:
    call = _Call()
    requests = call.requests(pb.ConsumeRequest())
    await requests.__anext__()  # the subscribe
    waiting = asyncio.ensure_future(requests.__anext__())
    await asyncio.sleep(0.05)
    assert not waiting.done(), "nothing queued yet: the stream waits"
    call.end()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 2)


async def test_queued_acks_travel_together_in_order() -> None:
    call = _Call()
    a, b, c = (_delivery(call, f"{i:028x}") for i in range(3))
    await a.ack()
    await b.ack()
    await c.dead_letter("bad")
    await _delivery(call, f"{9:028x}").ack()
    sent = await _drain(call)
    assert [m.WhichOneof("kind") for m in sent] == ["ack", "fail", "ack"]
    assert list(sent[0].ack.ids) == [a.id, b.id] and sent[1].fail.dead_letter


async def test_the_payload_and_times_are_converted() -> None:
    call = _Call()
    message = pb.Delivery(id="ab" * 14, stream_id="5-1", stream="s", group="g", attempts=3, traceparent="tp")
    message.minted_at.FromMilliseconds(1718000000123)
    message.raw_fields.add(name=b"\xff", value=b"v")
    message.payload["n"] = b"1"
    delivery = Delivery.from_proto(message, call)
    assert delivery.minted_at == datetime(2024, 6, 10, 6, 13, 20, 123000, tzinfo=timezone.utc)
    assert delivery.raw_fields == [(b"\xff", b"v")] and delivery.attempts == 3
    assert (delivery.stream_id, delivery.stream, delivery.group, delivery.traceparent) == ("5-1", "s", "g", "tp")
    assert type(delivery.payload) is dict and delivery.payload == {"n": b"1"}
    delivery.payload["n"] = b"2"  # the delivery's own dict, converted once
    assert delivery.payload == {"n": b"2"} and message.payload["n"] == b"1"
    await asyncio.sleep(0)


async def test_a_delivery_built_by_keyword_reads_back_what_it_was_given() -> None:
    minted = datetime(2024, 6, 10, 6, 13, 20, 123000, tzinfo=timezone.utc)
    delivery = Delivery(
        id="cd" * 14,
        stream_id="7-2",
        stream="s",
        group="g",
        payload={"k": b"v"},
        raw_fields=[],
        attempts=2,
        minted_at=minted,
        traceparent="tp",
        call=_Call(),
    )
    assert (delivery.id, delivery.stream_id, delivery.stream, delivery.group) == ("cd" * 14, "7-2", "s", "g")
    assert (delivery.attempts, delivery.traceparent, delivery.minted_at) == (2, "tp", minted)
    assert delivery.payload == {"k": b"v"} and delivery.raw_fields == []
    await asyncio.sleep(0)


async def _workers(ready: _Ready, count: int, handle: Callable[[Delivery], Awaitable[None]]) -> list[asyncio.Task[None]]:
    """`count` workers taking from `ready` as the consumer's do."""

    async def work() -> None:
        left: Delivery | None = None
        while True:
            if not ready.items:
                left = await ready.wait()
                continue
            delivery = ready.take(left)
            left = None
            await handle(delivery)

    tasks = [asyncio.create_task(work()) for _ in range(count)]
    await asyncio.sleep(0)  # all idle
    return tasks


async def test_a_frame_of_handlers_that_suspend_runs_side_by_side() -> None:
    ready, call, release = _Ready(), _Call(), asyncio.Event()
    running: list[str] = []

    async def handle(delivery: Delivery) -> None:
        running.append(delivery.id)
        await release.wait()

    workers = await _workers(ready, 8, handle)
    frame = [_delivery(call, f"{i:028x}") for i in range(6)]
    ready.put(frame)
    for _ in range(5):
        await asyncio.sleep(0)
    assert running == [d.id for d in frame], "every delivery of the frame has a handler running, in order"
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


async def test_a_frame_of_handlers_that_never_suspend_runs_in_one_worker() -> None:
    ready, call = _Ready(), _Call()
    handled: list[tuple[str, asyncio.Task[None] | None]] = []

    async def handle(delivery: Delivery) -> None:
        handled.append((delivery.id, asyncio.current_task()))

    workers = await _workers(ready, 8, handle)
    for frame in range(3):
        ready.put([_delivery(call, f"{frame * 100 + i:028x}") for i in range(50)])
        for _ in range(3):
            await asyncio.sleep(0)
    assert [i for i, _ in handled] == [f"{frame * 100 + i:028x}" for frame in range(3) for i in range(50)]
    for frame in range(3):
        assert len({task for _, task in handled[frame * 50 : frame * 50 + 50]}) == 1, "one worker ran the frame"
    assert len(ready._idle) == 8 and ready._waking == 0, "the second worker woken found nothing and went idle again"
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


def _sent_now(call: _Call) -> list[pb.ConsumeRequest]:
    """What the call has queued for the wire so far (without closing it)."""
    queued: list[pb.ConsumeRequest] = []
    while not call._outbox.empty():
        item = call._outbox.get_nowait()
        assert isinstance(item, pb.ConsumeRequest)
        queued.append(item)
    return queued


async def test_acks_are_coalesced_for_the_linger_window() -> None:
    call = _Call(ack_linger=0.05)
    deliveries = [_delivery(call, f"{i:028x}") for i in range(5)]
    for d in deliveries:
        assert await d.ack()
    assert _sent_now(call) == [], "acks wait for the window to close"
    await asyncio.sleep(0.1)
    [sent] = _sent_now(call)
    assert list(sent.ack.ids) == [d.id for d in deliveries]


async def test_a_full_ack_window_goes_out_at_once() -> None:
    call = _Call(ack_linger=60, max_ack_ids=4)
    for i in range(10):
        await _delivery(call, f"{i:028x}").ack()
    sent = _sent_now(call)
    assert [len(m.ack.ids) for m in sent] == [4, 4], "two full windows sent, the rest still coalescing"
    rest = await _drain(call)
    assert [list(m.ack.ids) for m in rest] == [[f"{8:028x}", f"{9:028x}"]], "finish flushes the partial window"


async def test_ack_messages_queued_back_to_back_travel_as_one() -> None:
    call = _Call(ack_linger=60, max_ack_ids=4)
    ids = [f"{i:028x}" for i in range(7)]
    for window in (ids[0:2], ids[2:3], ids[3:5]):  # three windows queued before the writer runs
        for id in window:
            await _delivery(call, id).ack()
        call.flush_acks()
    await _delivery(call, ids[5]).fail("no")
    await _delivery(call, ids[6]).ack()
    sent = await _drain(call)
    assert [m.WhichOneof("kind") for m in sent] == ["ack", "ack", "fail", "ack"]
    acked = [list(m.ack.ids) for m in sent if m.WhichOneof("kind") == "ack"]
    assert acked == [ids[0:3], ids[3:5], ids[6:7]], "merged up to max_ack_ids, never past a fail"


async def test_a_fail_flushes_the_acks_given_before_it() -> None:
    call = _Call(ack_linger=60)
    a, b, c = (_delivery(call, f"{i:028x}") for i in range(3))
    await a.ack()
    await b.fail("later")
    await c.ack()
    sent = _sent_now(call)
    assert [m.WhichOneof("kind") for m in sent] == ["ack", "fail"], "the fail goes out at once, after a's ack"
    assert list(sent[0].ack.ids) == [a.id] and sent[1].fail.id == b.id


def _offline(consumer: Consumer, call: _Call) -> None:
    """Readies `consumer` to be fed frames by hand on `call` (no channel, no run task)."""
    consumer._stopping = _Stopping()
    consumer._subscribed = asyncio.Event()
    consumer._call = call


def _frame(count: int) -> list[pb.Delivery]:
    return [pb.Delivery(id=f"{i:028x}", stream_id=f"{i}-0", stream="s", group="g", attempts=1) for i in range(count)]


async def _settle_down() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_acks_go_out_at_once_when_every_delivery_handed_out_was_handled() -> None:
    call = _Call(ack_linger=60)  # the linger never ends within the test
    consumer = Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW, flow_control=FlowControl(concurrency=4))
    _offline(consumer, call)
    consumer._spawn_workers(4)
    try:
        consumer._dispatch(call, _frame(5))
        await _settle_down()
        [sent] = _sent_now(call)
        assert list(sent.ack.ids) == [f"{i:028x}" for i in range(5)], "the sidecar waits for this credit: no linger"
        consumer._dispatch(call, _frame(2))
        await _settle_down()
        assert [list(m.ack.ids) for m in _sent_now(call)] == [[f"{i:028x}" for i in range(2)]], "one Ack a frame"
    finally:
        for worker in consumer._workers:
            worker.cancel()
        await asyncio.gather(*consumer._workers, return_exceptions=True)


async def test_acks_wait_for_the_linger_while_a_handler_still_runs() -> None:
    call, release = _Call(ack_linger=60), asyncio.Event()
    last = f"{2:028x}"

    async def handle(delivery: Delivery) -> None:
        if delivery.id == last:
            await release.wait()

    consumer = Consumer("127.0.0.1:1", "s", "g", handle, start=Start.NEW, flow_control=FlowControl(concurrency=4))
    _offline(consumer, call)
    consumer._spawn_workers(4)
    try:
        consumer._dispatch(call, _frame(3))
        await _settle_down()
        assert _sent_now(call) == [], "a handler still runs: its ack may share the message"
        release.set()
        await _settle_down()
        [sent] = _sent_now(call)
        assert list(sent.ack.ids) == [f"{i:028x}" for i in range(3)]
    finally:
        for worker in consumer._workers:
            worker.cancel()
        await asyncio.gather(*consumer._workers, return_exceptions=True)


async def test_a_batch_handlers_acks_go_out_when_nothing_waits() -> None:
    call = _Call(ack_linger=60)

    async def handle(batch: list[Delivery]) -> None:
        return None

    consumer = Consumer("127.0.0.1:1", "s", "g", start=Start.NEW, batch_handler=handle)
    _offline(consumer, call)
    consumer._spawn_workers(1)
    try:
        consumer._dispatch(call, _frame(3))
        await _settle_down()
        [sent] = _sent_now(call)
        assert list(sent.ack.ids) == [f"{i:028x}" for i in range(3)]
    finally:
        for worker in consumer._workers:
            worker.cancel()
        await asyncio.gather(*consumer._workers, return_exceptions=True)


async def test_an_iterations_acks_go_out_when_it_waits_for_more() -> None:
    call = _Call(ack_linger=60)
    consumer = Consumer("127.0.0.1:1", "s", "g", start=Start.NEW)
    _offline(consumer, call)
    consumer._task = asyncio.ensure_future(asyncio.Event().wait())  # stands for the run task
    iteration = consumer.deliveries()
    try:
        consumer._dispatch(call, _frame(2))
        for _ in range(2):
            delivery = await iteration.__anext__()
            assert await delivery.ack()
        assert _sent_now(call) == [], "the iteration has not asked for more yet"
        waiting = asyncio.ensure_future(iteration.__anext__())
        await _settle_down()
        [sent] = _sent_now(call)
        assert list(sent.ack.ids) == [f"{i:028x}" for i in range(2)] and not waiting.done()
        waiting.cancel()
    finally:
        consumer._task.cancel()
        await asyncio.gather(consumer._task, return_exceptions=True)


async def test_an_ended_call_drops_its_coalesced_acks() -> None:
    call = _Call(ack_linger=0.01)
    await _delivery(call).ack()
    call.end()
    await asyncio.sleep(0.05)  # the window's timer would have fired by now
    drained = [m async for m in call.requests(pb.ConsumeRequest())]
    assert drained == [pb.ConsumeRequest()], "a broken call's acks are never sent"


def test_max_batch_defaults_to_256_capped_by_max_in_flight() -> None:
    def subscribe(**kwargs: int) -> pb.Subscribe:
        return Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW, **kwargs)._subscribe.subscribe

    assert subscribe().max_batch == 256  # max_in_flight unset: a quarter of the cap, 1024; a frame never exceeds the credit
    assert subscribe().max_in_flight == 0  # unset is sent as 0: the sidecar's default (clients/CONTRACT.md)
    assert subscribe(max_in_flight=64).max_batch == 64
    assert subscribe(max_in_flight=1000).max_batch == 256
    assert subscribe(max_in_flight=1000, max_batch=1).max_batch == 1
    with pytest.raises(ValueError):
        subscribe(max_batch=0)


def test_per_key_limits_fill_the_subscribe_unchecked() -> None:
    def subscribe(**kwargs: Any) -> pb.Subscribe:
        return Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW, **kwargs)._subscribe.subscribe

    sub = subscribe(key_field="customer", max_in_flight_per_key=2)
    assert (sub.key_field, sub.max_in_flight_per_key) == ("customer", 2)
    assert (subscribe().key_field, subscribe().max_in_flight_per_key) == ("", 0)  # unset: no per-key limit
    # The sidecar checks the combinations (INVALID_ARGUMENT, raised as PermanentError): not the client.
    assert subscribe(key_field="customer").max_in_flight_per_key == 0
    with pytest.raises(ValueError):
        subscribe(max_in_flight_per_key=-1)  # a uint32, as max_deliveries


async def _noop_batch(deliveries: list[Delivery]) -> None:
    pass


def test_at_most_one_handler_kind_is_given() -> None:
    iterated = Consumer("127.0.0.1:1", "s", "g", start=Start.NEW)  # neither: iterated with `async for`
    assert iterated.concurrency == 0
    with pytest.raises(TypeError):
        Consumer("127.0.0.1:1", "s", "g", start=Start.NEW, concurrency=4)  # no workers to size
    with pytest.raises(TypeError):
        Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW).deliveries()  # a handler consumer is not iterated
    with pytest.raises(TypeError):
        Consumer("127.0.0.1:1", "s", "g", _noop, batch_handler=_noop_batch, start=Start.NEW)
    batch = Consumer("127.0.0.1:1", "s", "g", batch_handler=_noop_batch, start=Start.NEW, max_in_flight=8)
    assert batch.concurrency == 1 and batch.max_batch == 8


@pytest.mark.parametrize("max_in_flight, ids", [(1, 1), (4, 1), (8, 2), (64, 16), (1024, 256), (10_000, 256)])
def test_an_ack_carries_at_most_256_ids_and_a_quarter_of_max_in_flight(max_in_flight: int, ids: int) -> None:
    from echomq.consumer import max_ack_ids

    assert max_ack_ids(max_in_flight) == ids
    consumer = Consumer("127.0.0.1:1", "s", "g", _noop, start=Start.NEW, max_in_flight=max_in_flight)
    assert max_ack_ids(consumer._max_in_flight) == ids


async def test_a_lost_lease_sets_the_event_and_no_verdict_is_sent() -> None:
    call = _Call()
    delivery = _delivery(call)
    call.held[delivery.id] = delivery
    waiting = asyncio.ensure_future(delivery.lease_lost.wait())
    delivery._lose()
    await asyncio.wait_for(waiting, 1)
    assert not await delivery.ack() and not await delivery.fail("x") and not await delivery.dead_letter("y")
    assert not await delivery.extend(5)
    assert await _drain(call) == [], "nothing may be sent for a delivery whose lease was lost"


async def test_the_lease_lost_event_asked_for_after_the_loss_is_set() -> None:
    delivery = _delivery(_Call())
    delivery._lose()
    assert delivery.lease_lost.is_set()


def test_the_sync_delivery_gets_a_threading_event() -> None:
    import threading

    from echomq.sync import SyncDelivery

    loop = asyncio.new_event_loop()
    try:
        before = _delivery(_Call())
        early = SyncDelivery(before, loop)
        assert isinstance(early.lease_lost, threading.Event) and not early.lease_lost.is_set()
        before._lose()
        assert early.lease_lost.is_set()
        lost = _delivery(_Call())
        lost._lose()
        assert SyncDelivery(lost, loop).lease_lost.is_set()  # created after the loss
    finally:
        loop.close()


async def test_settling_releases_the_delivery_from_the_call() -> None:
    call = _Call()
    acked, failed = _delivery(call, "01" * 14), _delivery(call, "02" * 14)
    call.held.update({acked.id: acked, failed.id: failed})
    await acked.ack()
    await failed.fail("no")
    assert call.held == {}


class _Sidecar:
    """Stands for the stub: `Consume` answers with what the test puts in
    `responses` (None ends the call), and records what the client sends."""

    def __init__(self) -> None:
        self.responses: asyncio.Queue[pb.ConsumeResponse | None] = asyncio.Queue()
        self.sent: list[pb.ConsumeRequest] = []

    def Consume(self, requests: Any) -> Any:
        sidecar = self

        async def pull() -> None:
            async for request in requests:
                sidecar.sent.append(request)

        class Stream:
            def __init__(self) -> None:
                self._pull = asyncio.ensure_future(pull())

            def __aiter__(self) -> Stream:
                return self

            async def __anext__(self) -> pb.ConsumeResponse:
                response = await sidecar.responses.get()
                if response is None:
                    raise StopAsyncIteration
                return response

            def done(self) -> bool:
                return self._pull.done()

            def cancel(self) -> None:
                self._pull.cancel()

        return Stream()

    def acked(self) -> list[str]:
        return [id for m in self.sent if m.WhichOneof("kind") == "ack" for id in m.ack.ids]


def _lease_lost(id: str) -> pb.ConsumeResponse:
    return pb.ConsumeResponse(verdict_error=pb.VerdictError(id=id, code=pb.VERDICT_ERROR_CODE_LEASE_LOST))


def _batch(ids: list[str]) -> pb.ConsumeResponse:
    return pb.ConsumeResponse(
        batch=pb.DeliveryBatch(deliveries=[pb.Delivery(id=id, stream_id="1-0", stream="s", group="g") for id in ids])
    )


async def test_a_lease_lost_finds_the_delivery_wherever_the_call_still_holds_it() -> None:
    # One worker: `running` is in its handler, `waiting` in the ready queue,
    # `acked` settled before the LEASE_LOST comes (nothing to signal).
    running, waiting, acked, other = (f"{i:028x}" for i in range(4))
    release, handled, started = asyncio.Event(), [], []

    async def handle(delivery: Delivery) -> None:
        handled.append(delivery.id)
        started.append(delivery)
        if delivery.id == running:
            await release.wait()

    errors: list[VerdictError] = []
    consumer = Consumer(
        "127.0.0.1:1", "s", "g", handle, start=Start.NEW, ack_linger=60,
        flow_control=FlowControl(concurrency=1), on_verdict_error=errors.append,
    )
    call, sidecar = _Call(ack_linger=60), _Sidecar()
    _offline(consumer, call)
    consumer._stub = sidecar  # type: ignore[assignment]
    consumer._spawn_workers(1)
    serving = asyncio.ensure_future(consumer._serve(call))
    try:
        await sidecar.responses.put(_batch([acked]))
        await _settle_down()
        await sidecar.responses.put(_batch([running, waiting, other]))
        await _settle_down()
        assert handled == [acked, running]
        in_hand = started[-1]
        [queued, _] = consumer._ready.items
        for id in (running, waiting, acked):
            await sidecar.responses.put(_lease_lost(id))
        await _settle_down()
        assert in_hand.lease_lost.is_set() and queued._lost, "the running and the waiting delivery are signalled"
        assert [e.id for e in errors] == [running, waiting, acked], "every LEASE_LOST reaches the hook"
        release.set()
        await _settle_down()
        assert handled == [acked, running, other], "a lost delivery still waiting never gets a handler"
        call.flush_acks()
        await _settle_down()
        assert sidecar.acked() == [acked, other], "no verdict for a lost delivery"
    finally:
        await sidecar.responses.put(None)
        await asyncio.wait_for(serving, 2)
        for worker in consumer._workers:
            worker.cancel()
        await asyncio.gather(*consumer._workers, return_exceptions=True)


async def test_a_lease_lost_finds_an_iterated_delivery_and_one_with_an_ack_emit_in_flight() -> None:
    in_hand, emitting, settled = (f"{i:028x}" for i in range(3))
    consumer = Consumer("127.0.0.1:1", "s", "g", start=Start.NEW, ack_linger=60)
    call, sidecar = _Call(ack_linger=60), _Sidecar()
    _offline(consumer, call)
    consumer._stub = sidecar  # type: ignore[assignment]
    consumer._task = asyncio.ensure_future(asyncio.Event().wait())  # stands for the run task
    serving = asyncio.ensure_future(consumer._serve(call))
    iteration = consumer.deliveries()
    try:
        await sidecar.responses.put(_batch([in_hand, emitting, settled]))
        kept, emitted, done = [await iteration.__anext__() for _ in range(3)]
        assert await done.fail("no")
        answer = asyncio.ensure_future(emitted.ack_emit([("out", {"k": b"v"})]))
        await _settle_down()
        assert emitted.settled
        for id in (in_hand, emitting, settled):
            await sidecar.responses.put(_lease_lost(id))
        await _settle_down()
        assert kept.lease_lost.is_set() and not await kept.ack()
        assert emitted.lease_lost.is_set()
        with pytest.raises(AckEmitError) as refused:
            await answer
        assert refused.value.code is VerdictErrorCode.LEASE_LOST
        assert not done._lost, "settled before: nothing to signal"
        assert call.held == {}
    finally:
        await sidecar.responses.put(None)
        await asyncio.wait_for(serving, 2)
        consumer._task.cancel()
        await asyncio.gather(consumer._task, return_exceptions=True)


async def test_a_lease_lost_finds_a_delivery_whose_handler_a_stop_cancelled() -> None:
    id, started = f"{7:028x}", []

    async def handle(delivery: Delivery) -> None:
        started.append(delivery)
        await asyncio.Event().wait()

    consumer = Consumer("127.0.0.1:1", "s", "g", handle, start=Start.NEW, flow_control=FlowControl(concurrency=1))
    call, sidecar = _Call(ack_linger=60), _Sidecar()
    _offline(consumer, call)
    consumer._stub = sidecar  # type: ignore[assignment]
    consumer._spawn_workers(1)
    serving = asyncio.ensure_future(consumer._serve(call))
    try:
        await sidecar.responses.put(_batch([id]))
        await _settle_down()
        [delivery] = started
        assert consumer._stopping is not None
        consumer._stopping.set()  # as stop() does, then cancels a handler still running at its deadline
        [worker] = consumer._workers
        worker.cancel()
        await asyncio.gather(worker, return_exceptions=True)
        assert not delivery.settled, "still held by the call: delivered again once it ends"
        await sidecar.responses.put(_lease_lost(id))
        await _settle_down()
        assert delivery.lease_lost.is_set()
    finally:
        await sidecar.responses.put(None)
        await asyncio.wait_for(serving, 2)
