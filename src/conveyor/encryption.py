"""Sealing the arguments and results of tasks declared ``encrypt=True`` (AES-256-GCM).

A sealed payload is the plain payload (what :class:`~conveyor.encoding.Codec` wrote)
encrypted under one of the application's keys, laid out as::

    MAGIC (4) | n (1) | key id (n) | m (1) | bound to (m) | nonce (12) | ciphertext + tag (16)

The key id travels beside the ciphertext so that a process holding several keys opens a
payload sealed under any of them: keys are rotated by adding the new one as ``current``
while the old stays listed, until ``conveyor reseal`` has moved every queued job over.

"Bound to" names the job the payload belongs to (its public id), or, for a debounced
job whose arguments each enqueue replaces, ``key:`` and its dedupe key's HMAC. It is
authenticated with the task's name and the part (``args``, ``result``, ``step:NAME``) as
associated data, and the opener checks it against the job it reads for: a ciphertext
copied onto another job, another task, or from the arguments to the result does not open.
MAGIC starts with a NUL byte, which no JSON or MessagePack payload of conveyor's starts
with, so a sealed payload is told from a plain one by its first bytes (jobs stored before
a task was encrypted still run).

Dedupe keys of encrypted tasks are stored as a keyed HMAC (:meth:`Encryption.mac`),
never in clear.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import ConfigurationError, EncodingError, SerializationError

if TYPE_CHECKING:
    from .app import Conveyor
    from .task import Task

__all__ = ["ENCRYPTED", "MAGIC", "Encryption", "Unsealable", "Unwrapped", "is_sealed",
           "no_key", "open_payload", "seal_result", "unwrap"]

MAGIC = b"\x00cv\x01"
ENCRYPTED = "[encrypted]"  # what people see in place of a sealed value
_NONCE = 12
_TAG = 16


class Unsealable(EncodingError):
    """A sealed payload that this process cannot open: its key is not listed, or it was
    altered, or it belongs to another job, task or part."""


def is_sealed(data: bytes | None) -> bool:
    """Whether ``data`` is a sealed payload (by its first bytes; nothing is decrypted)."""
    return data is not None and data[:4] == MAGIC


@dataclass(slots=True)
class Unwrapped:
    """The parts of a sealed payload's header (nothing decrypted)."""

    key_id: str
    bound: str  # the public id of the job it belongs to, or "key:<hmac>"
    nonce: bytes
    body: bytes  # ciphertext and tag


def unwrap(data: bytes) -> Unwrapped:
    """The header of a sealed payload.

    :raises Unsealable: not a sealed payload, or its header is mangled
    """
    if not is_sealed(data):
        raise Unsealable("not a sealed payload")
    try:
        at = 5 + data[4]
        key_id = data[5:at].decode()
        end = at + 1 + data[at]
        bound = data[at + 1:end].decode()
    except (IndexError, UnicodeDecodeError):
        raise Unsealable("sealed payload with a mangled header") from None
    if len(data) < end + _NONCE + _TAG:
        raise Unsealable("sealed payload cut short")
    return Unwrapped(key_id, bound, data[end:end + _NONCE], data[end + _NONCE:])


class Encryption:
    """The keys that seal encrypted tasks' arguments and results.

    :param keys: key id -> 32-byte AES-256 key; every key that may still have sealed a
        stored job (keep an old key listed until ``conveyor reseal`` ran under the new one)
    :param current: the id of the key new payloads are sealed under
    :param mac_key: key of the HMAC that stands for an encrypted task's dedupe key
        (default: derived from the ``current`` key, so a rotation starts new dedupe
        identities; give a key of its own to keep them across rotations)
    :raises ConfigurationError: a key is not 32 bytes, an id is empty or too long, or
        ``current`` is not among ``keys``
    """

    def __init__(self, keys: Mapping[str, bytes], current: str, *,
                 mac_key: bytes | None = None) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise ConfigurationError("Encryption(keys=...) needs at least one key: a dict of"
                                     " key id -> 32 bytes")
        self._ciphers: dict[str, AESGCM] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not key_id or len(key_id.encode()) > 64:
                raise ConfigurationError(f"an encryption key id must be a non-empty str of at"
                                         f" most 64 bytes: {key_id!r}")
            if not isinstance(key, bytes) or len(key) != 32:
                size = len(key) if isinstance(key, bytes) else type(key).__name__
                raise ConfigurationError(f"encryption key {key_id!r} must be 32 bytes"
                                         f" (AES-256), got {size}")
            self._ciphers[key_id] = AESGCM(key)
        if current not in self._ciphers:
            raise ConfigurationError(f"current={current!r} is not one of the keys"
                                     f" ({', '.join(sorted(self._ciphers))})")
        if mac_key is not None and (not isinstance(mac_key, bytes) or len(mac_key) < 16):
            raise ConfigurationError("mac_key must be at least 16 bytes")
        self.current = current
        self._cipher = self._ciphers[current]
        self._head = MAGIC + _short(current)
        self._mac_key = mac_key if mac_key is not None else hashlib.sha256(
            b"conveyor dedupe key\x00" + keys[current]).digest()

    def __repr__(self) -> str:  # never the keys themselves
        return f"<Encryption current={self.current!r} keys={self.key_ids}>"

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._ciphers)

    def seal(self, plain: bytes, bound: str, task: str, part: str) -> bytes:
        """``plain`` sealed under the current key for the job ``bound`` (its public id, or
        ``key:<hmac>``), task ``task`` and ``part`` (``args``, ``result``, ``step:NAME``)."""
        nonce = os.urandom(_NONCE)
        bound_raw = bound.encode()
        if len(bound_raw) > 255:
            raise ValueError(f"too long to bind a sealed payload to: {bound[:40]!r}...")
        body = self._cipher.encrypt(nonce, plain, b"%b\x00%b\x00%b" % (
            bound_raw, task.encode(), part.encode()))
        return b"".join((self._head, bytes((len(bound_raw),)), bound_raw, nonce, body))

    def open(self, sealed: bytes, task: str, part: str, job_id: str | None = None) -> bytes:
        """The plain payload of ``sealed``, read for the job ``job_id`` (None: the job it
        names, when the reader cannot know it, as a parent reading its child's result).

        :raises Unsealable: a mangled payload, a key this process does not have, or a
            payload that does not open (altered, or sealed for another job, task or part)
        """
        head = self._head
        if sealed[:len(head)] == head:  # the current key: the common case, parsed inline
            at = len(head)
            end = at + 1 + sealed[at] if len(sealed) > at else 0
            if end and len(sealed) >= end + _NONCE + _TAG:
                bound = sealed[at + 1:end]
                if job_id is not None and bound[:4] != b"key:" and bound != job_id.encode():
                    raise self._moved(bound.decode(errors="replace"), job_id)
                try:
                    return self._cipher.decrypt(sealed[end:end + _NONCE],
                                                sealed[end + _NONCE:],
                                                b"%b\x00%b\x00%b" % (bound, task.encode(),
                                                                      part.encode()))
                except InvalidTag:
                    raise self._unopened(self.current, task, part) from None
        w = unwrap(sealed)
        cipher = self._ciphers.get(w.key_id)
        if cipher is None:
            raise Unsealable(f"sealed with encryption key {w.key_id!r}, which this process"
                             f" does not have (it has {', '.join(self.key_ids)})")
        if job_id is not None and w.bound != job_id and w.bound[:4] != "key:":
            raise self._moved(w.bound, job_id)
        try:
            return cipher.decrypt(w.nonce, w.body, f"{w.bound}\x00{task}\x00{part}".encode())
        except InvalidTag:
            raise self._unopened(w.key_id, task, part) from None

    @staticmethod
    def _moved(bound: str, job_id: str) -> Unsealable:
        return Unsealable(f"sealed for job {bound!r}, not {job_id!r}: moved from another job")

    @staticmethod
    def _unopened(key_id: str, task: str, part: str) -> Unsealable:
        return Unsealable(f"sealed payload does not open with key {key_id!r}: altered, or"
                          f" sealed for another task or part than {task!r} {part}")

    def reseal(self, sealed: bytes, task: str, part: str) -> bytes | None:
        """``sealed`` sealed again under the current key (for the same job, task and part);
        None when it already is.

        :raises Unsealable: it does not open here
        """
        w = unwrap(sealed)
        if w.key_id == self.current:
            return None
        return self.seal(self.open(sealed, task, part), w.bound, task, part)

    def mac(self, text: str) -> str:
        """The keyed HMAC that stands for ``text`` (an encrypted task's dedupe key) in
        Redis: equal texts give equal MACs, and the text cannot be read back."""
        digest = hmac.new(self._mac_key, text.encode(), hashlib.sha256).digest()[:18]
        return "hmac:" + base64.urlsafe_b64encode(digest).decode()


def _short(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 255:
        raise ValueError(f"too long to bind a sealed payload to: {text[:40]!r}...")
    return bytes([len(raw)]) + raw


def no_key(data: bytes) -> Unsealable:
    """The error of a sealed payload met by an application configured without encryption."""
    try:
        named = f"encryption key {unwrap(data).key_id!r}"
    except Unsealable:
        named = "an encryption key"
    return Unsealable(f"sealed with {named}, and this process has no encryption keys"
                      " (Conveyor(..., encryption=conveyor.Encryption(...)))")


def open_payload(encryption: Encryption | None, data: bytes, task: str, part: str,
                 job_id: str | None = None) -> bytes:
    """``data`` as the codec reads it: opened when sealed, as it is when not.

    :raises Unsealable: sealed, and this process cannot open it (see :meth:`Encryption.open`)
    """
    if data[:4] != MAGIC:
        return data
    if encryption is None:
        raise no_key(data)
    return encryption.open(data, task, part, job_id)


def seal_result(app: Conveyor, task: Task[Any, Any], job_id: str, payload: bytes,
                part: str = "result") -> bytes:
    """An encrypted task's encoded result (or step value, ``part="step:NAME"``) sealed for
    the job ``job_id``.

    :raises SerializationError: the app has no encryption keys (the value is not stored)
    """
    if app.encryption is None:
        raise SerializationError(
            f"task {task.name!r} is declared encrypt=True, but this process has no"
            " encryption keys to seal its result with")
    return app.encryption.seal(payload, job_id, task.name, part)
