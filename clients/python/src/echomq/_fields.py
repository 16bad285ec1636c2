"""Entry fields as the clients take them and as the wire carries them: a
leaf module (it imports nothing of the package), so appends and deliveries
(AckEmit's emits) share it without importing each other."""

from __future__ import annotations

from collections.abc import Mapping

#: Field values: bytes, or text (sent as UTF-8).
Fields = Mapping[str, bytes | bytearray | memoryview | str]


def encode_fields(fields: Fields) -> dict[str, bytes]:
    """Field values as bytes; text is encoded as UTF-8.

    Raises TypeError for a field name that is not text."""
    encoded: dict[str, bytes] = {}
    for name, value in fields.items():
        if not isinstance(name, str):
            raise TypeError(f"field names are text, got {type(name).__name__}")
        encoded[name] = value.encode() if isinstance(value, str) else bytes(value)
    return encoded
