"""Scheduled entries (`deliver_at` / `delay`, `cancel_scheduled`,
`list_scheduled` / `scheduled`) against the real sidecar and Redis: what the
client sends, what it answers, and the sidecar's refusals mapped like every
other error. The delivery itself is the conformance scenarios'
`scheduled_delivery` and `scheduled_cancel`."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

import grpc
import pytest
import redis

from echomq import BatchEntry, NotScheduledError, PermanentError, ScheduledEntry, Streams
from echomq import sync as echomq_sync
from support import Sidecar


@pytest.fixture
def fresh(redis_client: redis.Redis, request: pytest.FixtureRequest) -> str:
    """A stream named after the test, deleted first."""
    stream = f"py:scheduled:{request.node.name}"
    redis_client.delete(stream)
    return stream


async def test_a_scheduled_append_is_listed_not_read_then_enters_the_stream(live_sidecar: Sidecar, fresh: str) -> None:
    due = datetime.now(timezone.utc) + timedelta(seconds=1)
    async with Streams(live_sidecar.target) as streams:
        later = await streams.append(fresh, {"n": "1"}, deliver_at=due)
        assert later.scheduled and later.stream_id == "" and len(later.id) == 28
        now = await streams.append(fresh, {"n": "0"})
        assert not now.scheduled and now.stream_id

        page = await streams.list_scheduled(fresh)
        assert page.total == 1 and page.next_page_token is None
        [entry] = page.entries
        assert entry.id == later.id and entry.fields["n"] == b"1"
        # Millisecond precision on the wire's way through Redis.
        assert abs((entry.deliver_at - due).total_seconds()) < 0.002
        assert [e.id for e in (await streams.read(fresh)).entries] == [now.id]

        deadline = time.monotonic() + 10
        while len((await streams.read(fresh)).entries) < 2:
            assert time.monotonic() < deadline, "the scheduled entry never entered the stream"
            await asyncio.sleep(0.05)
        assert datetime.now(timezone.utc) >= due - timedelta(milliseconds=5)
        assert [e.id for e in (await streams.read(fresh)).entries] == [now.id, later.id]
        assert (await streams.list_scheduled(fresh)).total == 0


async def test_list_scheduled_pages_by_due_time_and_cancel_answers_the_due_time(
    live_sidecar: Sidecar, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        results = await streams.append_batch(
            fresh,
            [
                BatchEntry({"n": "3"}, delay=timedelta(minutes=3)),
                {"n": "now"},
                BatchEntry({"n": "1"}, delay=timedelta(minutes=1)),
                BatchEntry({"n": "2"}, deliver_at=datetime.now(timezone.utc) + timedelta(minutes=2)),
            ],
        )
        assert [r.scheduled for r in results] == [True, False, True, True]
        first = await streams.list_scheduled(fresh, count=2)
        assert first.total == 3 and first.next_page_token is not None
        assert [e.fields["n"] for e in first.entries] == [b"1", b"2"]
        rest = await streams.list_scheduled(fresh, page_token=first.next_page_token, count=2)
        assert [e.fields["n"] for e in rest.entries] == [b"3"] and rest.next_page_token is None
        every: list[ScheduledEntry] = [e async for e in streams.scheduled(fresh, page_size=1)]
        assert [e.id for e in every] == [results[2].id, results[3].id, results[0].id]

        due = await streams.cancel_scheduled(fresh, results[0].id)
        assert due == every[2].deliver_at
        with pytest.raises(NotScheduledError) as again:
            await streams.cancel_scheduled(fresh, results[0].id)
        assert again.value.code == grpc.StatusCode.NOT_FOUND and again.value.permanent
        with pytest.raises(NotScheduledError):
            await streams.cancel_scheduled(fresh, results[1].id)  # appended at once: never scheduled
        assert [e.id async for e in streams.scheduled(fresh)] == [results[2].id, results[3].id]


async def test_the_sidecars_refusals_are_permanent_errors(live_sidecar: Sidecar, fresh: str) -> None:
    async with Streams(live_sidecar.target) as streams:
        with pytest.raises(PermanentError) as both:
            await streams.append(
                fresh, {"n": "1"}, deliver_at=datetime.now(timezone.utc) + timedelta(minutes=1), delay=timedelta(minutes=1)
            )
        assert both.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(PermanentError) as negative:
            await streams.append_batch(fresh, [BatchEntry({"n": "1"}, delay=timedelta(seconds=-1))])
        assert negative.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(PermanentError) as bad_id:
            await streams.cancel_scheduled(fresh, "not-a-branded-id")
        assert bad_id.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert not isinstance(bad_id.value, NotScheduledError)
        assert (await streams.list_scheduled(fresh)).total == 0


async def test_a_schedule_of_the_wrong_type_is_a_type_error_that_says_what_to_pass(
    live_sidecar: Sidecar, fresh: str
) -> None:
    async with Streams(live_sidecar.target) as streams:
        with pytest.raises(TypeError, match=r"timedelta\(minutes=10\)"):
            await streams.append(fresh, {"n": "1"}, delay=5)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="deliver_at must be a datetime"):
            await streams.append(fresh, {"n": "1"}, deliver_at="2027-01-01")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="delay must be"):
            await streams.append_batch(fresh, [BatchEntry({"n": "1"}, delay=1.5)])  # type: ignore[arg-type]
        assert (await streams.list_scheduled(fresh)).total == 0, "nothing was sent"


def test_the_sync_streams_schedule_list_and_cancel(live_sidecar: Sidecar, fresh: str) -> None:
    with echomq_sync.Streams(live_sidecar.target) as streams:
        result = streams.append(fresh, {"n": "1"}, delay=timedelta(minutes=5))
        assert result.scheduled
        assert [e.id for e in streams.scheduled(fresh)] == [result.id]
        assert streams.list_scheduled(fresh).total == 1
        streams.cancel_scheduled(fresh, result.id)
        with pytest.raises(NotScheduledError):
            streams.cancel_scheduled(fresh, result.id)
        assert streams.list_scheduled(fresh).entries == []
