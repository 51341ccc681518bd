"""Copy a filled Redis keyspace so every drain run starts from the same jobs.

Filling 20,000 jobs through a peer's API can take longer than draining them,
so the harness fills once (through the peer's own API, so the data is exactly
what the peer writes), snapshots every key with ``DUMP``/``PTTL``, and before
each run does ``FLUSHALL`` + ``RESTORE``.  ``DUMP`` keeps stream consumer groups,
so taskiq's group survives the round trip.
"""

from __future__ import annotations

import redis

Snapshot = list[tuple[bytes, int, bytes]]
BATCH = 1000


def take(client: redis.Redis) -> Snapshot:
    """Every key with its remaining TTL in ms (0 = none) and serialized value."""
    keys = list(client.scan_iter(count=BATCH))
    out: Snapshot = []
    for start in range(0, len(keys), BATCH):
        chunk = keys[start : start + BATCH]
        pipe = client.pipeline(transaction=False)
        for key in chunk:
            pipe.pttl(key)
            pipe.dump(key)
        replies = pipe.execute()
        for i, key in enumerate(chunk):
            ttl, value = replies[2 * i], replies[2 * i + 1]
            if value is not None:  # expired between SCAN and DUMP
                out.append((key, max(int(ttl), 0), value))
    return out


def restore(client: redis.Redis, snap: Snapshot) -> None:
    """Replace the keyspace with *snap*."""
    client.flushall()
    for start in range(0, len(snap), BATCH):
        pipe = client.pipeline(transaction=False)
        for key, ttl, value in snap[start : start + BATCH]:
            pipe.restore(key, ttl, value, replace=True)
        pipe.execute()
