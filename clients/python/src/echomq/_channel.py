"""Channel construction shared by the consumer and the unary clients, and the
channel ownership the unary clients (Streams, Admin) share; the blocking ones
of `echomq.sync` run these on a loop of their own."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc

from .options import Backoff, Seconds, seconds

#: Largest message (bytes) the client sends or accepts. Redis values can be far
#: larger than gRPC's 4 MiB default; 256 MiB covers big entries and batches.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

ChannelOptions = Sequence[tuple[str, Any]]


def default_options(backoff: Backoff) -> list[tuple[str, Any]]:
    """gRPC channel options matching the client's reconnect policy.

    gRPC's own subchannel backoff (1 s growing to 120 s by default) decides when
    a call on a broken channel may even try to connect again, so it is aligned
    with `backoff`; otherwise a restarted sidecar could wait minutes for us.
    """
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.initial_reconnect_backoff_ms", int(backoff.initial * 1000)),
        ("grpc.min_reconnect_backoff_ms", int(backoff.initial * 1000)),
        ("grpc.max_reconnect_backoff_ms", int(backoff.maximum * 1000)),
    ]


def authority_options(target: str) -> list[tuple[str, Any]]:
    """For a unix socket, `:authority` = `localhost` (as grpc-go sends).

    gRPC C-core otherwise sends the socket path as the HTTP/2 `:authority`,
    which the sidecar's HTTP/2 server (hyper) rejects as malformed: every call
    would end with RST_STREAM PROTOCOL_ERROR ("INTERNAL: Stream removed").
    """
    return [("grpc.default_authority", "localhost")] if target.startswith(("unix:", "unix-abstract:")) else []


def merge(defaults: ChannelOptions, overrides: ChannelOptions) -> list[tuple[str, Any]]:
    """Options with `overrides` winning over `defaults` by name."""
    merged = dict(defaults)
    merged.update(dict(overrides))
    return list(merged.items())


def aio_channel(
    target: str,
    backoff: Backoff,
    options: ChannelOptions = (),
    interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
) -> grpc.aio.Channel:
    """An insecure asyncio channel to `target` (`host:port` or `unix:/path`):
    the sidecar is pod-local, on loopback or a unix socket."""
    return grpc.aio.insecure_channel(
        target,
        options=merge(default_options(backoff) + authority_options(target), options),
        interceptors=list(interceptors) or None,
    )


_Aio = TypeVar("_Aio", bound="AioClient")


class AioClient:
    """One asyncio channel: made from a `host:port` / `unix:/path` target (and
    closed by `close()`), or given by the caller (and left open). `timeout`
    (seconds or timedelta, default none) is what each call of the subclass
    passes to gRPC, on the subclass's `_stub_class` stub of the channel.
    `channel_options` and `interceptors` apply when the client makes the
    channel."""

    #: The generated gRPC stub class the subclass calls (`self._stub`).
    _stub_class: Any

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        *,
        timeout: Seconds | None = None,
        channel_options: ChannelOptions = (),
        interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    ) -> None:
        self._owns_channel = isinstance(target, str)
        self._channel: grpc.aio.Channel = (
            aio_channel(target, Backoff(), channel_options, interceptors) if isinstance(target, str) else target
        )
        self._timeout = None if timeout is None else seconds(timeout)
        self._stub = self._stub_class(self._channel)

    async def close(self) -> None:
        """Closes the channel if this client created it."""
        if self._owns_channel:
            await self._channel.close()

    async def __aenter__(self: _Aio) -> _Aio:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()
