"""Channel construction shared by the consumer and the producer, and the
channel ownership the unary clients (Producer, Streams, Admin; asyncio and
blocking) share."""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType
from typing import Any, TypeVar

import grpc

from .options import Backoff

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


def blocking_channel(target: str, channel_options: ChannelOptions = ()) -> grpc.Channel:
    """An insecure blocking channel to `target`, with the message limits and
    the authority that `aio_channel` sets."""
    defaults = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ]
    defaults += authority_options(target)
    return grpc.insecure_channel(target, options=merge(defaults, channel_options))


_Aio = TypeVar("_Aio", bound="AioClient")
_Blocking = TypeVar("_Blocking", bound="BlockingClient")


class AioClient:
    """One asyncio channel: made from a `host:port` / `unix:/path` target (and
    closed by `close()`), or given by the caller (and left open). `timeout`
    (seconds or `None`) is what each call of the subclass passes to gRPC."""

    def __init__(
        self,
        target: str | grpc.aio.Channel,
        timeout: float | None,
        channel_options: ChannelOptions,
        interceptors: Sequence[grpc.aio.ClientInterceptor],
    ) -> None:
        self._owns_channel = isinstance(target, str)
        self._channel: grpc.aio.Channel = (
            aio_channel(target, Backoff(), channel_options, interceptors) if isinstance(target, str) else target
        )
        self._timeout = timeout

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


class BlockingClient:
    """`AioClient`'s blocking twin, over a `grpc.Channel`."""

    def __init__(self, target: str | grpc.Channel, timeout: float | None, channel_options: ChannelOptions) -> None:
        self._owns_channel = isinstance(target, str)
        self._channel: grpc.Channel = (
            blocking_channel(target, channel_options) if isinstance(target, str) else target
        )
        self._timeout = timeout

    def close(self) -> None:
        """Closes the channel if this client created it."""
        if self._owns_channel:
            self._channel.close()

    def __enter__(self: _Blocking) -> _Blocking:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()
