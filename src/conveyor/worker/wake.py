"""Waking idle workers: a marker on a queue's wake key means "there may be work".

An idle worker blocks on its queues' wake keys (one BLPOP for all of them), so it sends
a few commands a minute and starts new work within milliseconds of its enqueue. On a
Redis Cluster one BLPOP may only name keys of one slot, so there the worker blocks once
per slot its queues hash to (in practice once per queue), each as cheap as the one BLPOP.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis.exceptions
from redis.crc import key_slot

from .. import clients
from .backoff import CONNECTION_ERRORS, pause_after

if TYPE_CHECKING:
    from . import Worker

log = logging.getLogger("conveyor.worker")
WAKE_BLOCK_SECONDS = 20.0  # longest BLPOP; after each quiet spell the lease deadlines are read
# A cluster mid-failover or mid-resharding answers with errors of its own: wait and retry.
ERRORS = (*CONNECTION_ERRORS, redis.exceptions.ClusterError,
          redis.exceptions.RedisClusterException)


async def listen_for_wakeups(worker: Worker) -> None:
    """Block on the queues' wake keys; a marker means "there may be work"."""
    # A client of its own: its socket timeout must outlast the longest block.
    client = clients.async_client(
        worker.app.url, socket_timeout=WAKE_BLOCK_SECONDS + 5, socket_connect_timeout=5
    )
    try:
        if clients.is_cluster(worker.app.url):
            await asyncio.gather(*(_wait_for_markers(worker, client, queues)
                                   for queues in _by_slot(worker)))
        else:
            await _wait_for_markers(worker, client, worker.queues)
    finally:
        await client.aclose()


def _by_slot(worker: Worker) -> list[list[str]]:
    """The worker's queues grouped by the cluster slot of their wake keys."""
    groups: dict[int, list[str]] = {}
    for queue in worker.queues:
        groups.setdefault(key_slot(worker.app.keys(queue).wake.encode()), []).append(queue)
    return list(groups.values())


async def _wait_for_markers(worker: Worker, client: Any, queues: Sequence[str]) -> None:
    wake_keys = [worker.app.keys(q).wake for q in queues]
    failures = 0
    while True:
        try:
            reply = await client.blpop(wake_keys, timeout=WAKE_BLOCK_SECONDS)
            if reply is None:
                await _arm_for_leases(worker, client, queues)
            failures = 0
        except ERRORS as exc:
            failures += 1
            await asyncio.sleep(pause_after(failures))
            log.debug("wake listener reconnecting after %s", exc)
            worker.wake_all()
            continue
        if reply is None:
            continue
        if len(worker.held) >= worker.concurrency:
            # No free slot here: pass the marker on to another worker, and block again only
            # once a slot is free (before that this worker would take its marker back at
            # once, again and again).
            await client.lpush(reply[0], b"1")
            await client.ltrim(reply[0], 0, 0)
            while len(worker.held) >= worker.concurrency:
                worker.slot_freed.clear()
                await worker.slot_freed.wait()
        worker.wake_all()


async def _arm_for_leases(worker: Worker, client: Any, queues: Sequence[str]) -> None:
    """After a quiet spell, set the timer for the earliest lease of each queue. A worker
    that dies holding jobs wakes nobody, and this worker's last fetch may predate the
    lease: without this its job would wait for the next enqueue to be reclaimed. One
    command per queue per quiet spell."""
    for queue in queues:
        first = await client.zrange(worker.app.keys(queue).leases, 0, 0, withscores=True)
        known = worker.next_due.get(queue)
        if first and (known is None or float(first[0][1]) < known):
            worker.next_due[queue] = float(first[0][1])
            assert worker.nudge is not None
            worker.nudge.set()
