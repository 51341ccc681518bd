"""Warn loudly at start when the Redis server is configured so that it can lose jobs."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("conveyor.worker")


def _as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def risks(config: dict[str, Any], persistence: dict[str, Any]) -> list[str]:
    """Plain sentences naming each setting that can lose jobs (empty when safe)."""
    found = []
    policy = _as_text(config.get("maxmemory-policy", "noeviction"))
    if policy != "noeviction":
        found.append(
            f"maxmemory-policy is {policy!r}: Redis may evict job records under memory"
            " pressure; set it to 'noeviction'"
        )
    aof = str(persistence.get("aof_enabled", 0)) == "1"
    rdb = bool(_as_text(config.get("save", "")).strip())
    if not aof and not rdb:
        found.append(
            "persistence is off (no AOF, no RDB snapshots): a Redis restart loses every job;"
            " enable appendonly yes"
        )
    return found


async def check_server(client: Any) -> list[str]:
    """Log a warning for each risk; managed servers that forbid CONFIG are skipped."""
    try:
        config = dict(await client.config_get("maxmemory-policy"))
        config.update(await client.config_get("save"))
        config = {_as_text(k): v for k, v in config.items()}
        persistence = await client.info("persistence")
    except Exception as exc:  # CONFIG may be renamed or forbidden on managed Redis
        log.info("could not read the Redis configuration (%s); skipping the safety check", exc)
        return []
    found = risks(config, persistence)
    for risk in found:
        log.warning("Redis can lose jobs: %s", risk)
    return found
