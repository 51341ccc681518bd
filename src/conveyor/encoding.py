"""Payload encoding with msgspec: JSON by default, MessagePack optional, never pickle.

A payload stored in Redis is data only; decoding it can never run code on a worker.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .errors import EncodingError, PayloadTooLarge, SerializationError

DEFAULT_MAX_PAYLOAD = 1 << 20  # 1 MiB

Format = Literal["json", "msgpack"]

# What msgspec encodes, named in the error of a value it cannot. A worker gives the task
# each of these as its parameter's annotation says (see conveyor.hints).
SUPPORTED = ("str, int, float, bool, None, list, tuple, set, frozenset, dict (str, int,"
             " UUID, ... keys), datetime, date, time, timedelta, UUID, Decimal, bytes,"
             " bytearray, enum, Literal, dataclass, NamedTuple, TypedDict, msgspec.Struct")


class Codec:
    """Encodes task arguments and results, and checks their size.

    :param format: ``"json"`` (readable in redis-cli) or ``"msgpack"`` (smaller, faster)
    :param max_payload: largest encoded argument payload accepted at enqueue, in bytes
    """

    def __init__(self, format: Format = "json", max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        if format == "json":
            self._encoder: msgspec.json.Encoder | msgspec.msgpack.Encoder = msgspec.json.Encoder()
            self._decoder: msgspec.json.Decoder[Any] | msgspec.msgpack.Decoder[Any] = (
                msgspec.json.Decoder()
            )
        elif format == "msgpack":
            self._encoder = msgspec.msgpack.Encoder()
            self._decoder = msgspec.msgpack.Decoder()
        else:
            raise ValueError(f"unknown encoding format {format!r}: use 'json' or 'msgpack'")
        self.format = format
        self.max_payload = max_payload

    def encode_args(self, task: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                    meta: dict[str, str] | None = None) -> bytes:
        """Encode the arguments of one call of ``task``: ``[args]``, ``[args, kwargs]``, or
        ``[args, kwargs, meta]`` when hooks (tracing) gave string entries to carry along.

        :raises SerializationError: an argument has a type that cannot be encoded
        :raises PayloadTooLarge: the encoded arguments exceed ``max_payload``
        """
        try:
            if meta:
                data = self._encoder.encode((args, kwargs, meta))
            else:
                data = self._encoder.encode((args, kwargs) if kwargs else (args,))
        except (TypeError, msgspec.EncodeError, OverflowError) as exc:
            raise SerializationError(
                f"cannot encode the arguments of task {task!r}: {exc}"
                f" (supported: {SUPPORTED})"
            ) from exc
        if len(data) > self.max_payload:
            raise PayloadTooLarge(
                f"the arguments of task {task!r} encode to {len(data)} bytes, over the limit"
                f" of {self.max_payload} bytes; store large data elsewhere and pass a reference"
            )
        return data

    def decode_args(self, data: bytes) -> tuple[list[Any], dict[str, Any]]:
        """Decode what :meth:`encode_args` wrote.

        :raises EncodingError: the payload is corrupt or not of the expected shape
        """
        try:
            value = self._decoder.decode(data)
        except (msgspec.DecodeError, ValueError) as exc:
            raise EncodingError(f"corrupt payload: {exc}") from exc
        if not isinstance(value, list) or not 1 <= len(value) <= 3:
            raise EncodingError("corrupt payload: expected [args] or [args, kwargs]")
        args = value[0]
        kwargs = value[1] if len(value) >= 2 else {}
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise EncodingError("corrupt payload: expected [args] or [args, kwargs]")
        return args, kwargs

    def decode_meta(self, data: bytes) -> dict[str, str]:
        """The string entries hooks carried with a job (see :mod:`conveyor.hooks`); empty
        when there are none or they are not strings."""
        value = self._decoder.decode(data)
        if not isinstance(value, list) or len(value) != 3 or not isinstance(value[2], dict):
            return {}
        return {k: v for k, v in value[2].items() if isinstance(k, str) and isinstance(v, str)}

    def encode_result(self, value: Any) -> bytes:
        """Encode a task's return value.

        :raises SerializationError: the value has a type that cannot be encoded
        """
        try:
            return self._encoder.encode(value)
        except (TypeError, msgspec.EncodeError, OverflowError) as exc:
            raise SerializationError(
                f"cannot encode the task's return value: {exc} (supported: {SUPPORTED})"
            ) from exc

    def decode_result(self, data: bytes | None) -> Any:
        """Decode a stored result; ``None`` when there is none."""
        if data is None or data == b"":
            return None
        try:
            return self._decoder.decode(data)
        except (msgspec.DecodeError, ValueError) as exc:
            raise EncodingError(f"corrupt result: {exc}") from exc
