"""Channel construction shared by the consumer and the producer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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
