"""What the sync transport does differently from the async one, for real (hand-written,
as its twin ``_async/io.py``; ``transport.py`` beside it is generated and imports these
names from here, as the async one imports them from its own ``io``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import ResponseError

from ..packing import wire

if TYPE_CHECKING:
    from ..packing import ScriptCall

__all__ = ["Pipelines", "Script", "exchange", "pipelines_scripts", "sent_later"]


def pipelines_scripts(client: Any) -> bool:
    """Whether ``client``'s pipelines take script calls: a cluster pipeline refuses
    EVALSHA (``Script`` itself routes it by its first key's slot and loads a missing script
    on every primary), so there callers send script calls one by one."""
    return not isinstance(client, RedisCluster)


def sent_later(client: Any) -> bool:
    """Whether a call given ``client`` is only queued on it: a sync runner's ``run`` takes a
    pipeline there, whose ``execute()`` returns the reply."""
    return client is not None


class Pipelines:
    """What only the sync runner does: add calls to a pipeline of the caller's."""

    _scripts: dict[str, Script]

    def queue(self, call: ScriptCall[Any], pipeline: Any) -> None:
        """Add ``call`` to ``pipeline``; its raw reply appears in ``pipeline.execute()``."""
        keys, args = wire(call)
        self._scripts[call.name](keys=keys, args=args, client=pipeline)


def exchange(conn: Any, message: bytes, queued: int) -> list[Any]:
    """Send a packed MULTI and read every reply; EXEC's, or the error that aborted it."""
    conn.send_packed_command([message])
    refused = None
    for _ in range(queued):  # +OK, +QUEUED; a command refused here (OOM) fails EXEC
        try:
            conn.read_response()
        except ResponseError as exc:
            refused = refused or exc
    return _exec_reply(conn.read_response, refused)


def _exec_reply(read: Callable[[], Any], refused: ResponseError | None) -> list[Any]:
    """EXEC's reply; when it aborted, the error of the command that made it (every reply
    has been read either way, so the connection stays usable)."""
    try:
        return read()  # type: ignore[no-any-return]
    except ResponseError as exc:
        raise refused or exc from None
