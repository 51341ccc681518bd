"""Warn loudly at start when the Redis server lacks what conveyor needs or is configured
so that it can lose jobs: the checks of ``conveyor doctor`` (:mod:`conveyor.doctor`), run
once, each problem logged as a WARNING line with its fix."""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError

from ..doctor import problems, run_checks

log = logging.getLogger("conveyor.worker")


async def check_server(client: Any, namespace: str = "conveyor") -> list[str]:
    """Log a warning for each check that warned or failed; the sentences logged.

    A server that answers the checks oddly (a proxy, an engine without ``INFO`` sections)
    is noted at INFO level and the worker goes on: the checks advise, they never stop it.
    """
    try:
        report = await run_checks(client, namespace)
    except RedisError as exc:
        log.info("could not check the Redis server (%s); skipping the start-up check", exc)
        return []
    except Exception:  # a bug in an advisory check must not keep the worker from running
        log.warning("the Redis server check failed; skipping it", exc_info=True)
        return []
    found = problems(report)
    for problem in found:
        log.warning("Redis server check: %s (conveyor doctor tells more)", problem)
    return found
