"""The TCP proxy between one worker process and Redis, for black-hole and reset faults.

It is :class:`conveyor.faults.proxy.Proxy` when that module is present; without it a run
skips the proxy faults and says so in its report.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["ProxyLink", "open_proxy"]


class ProxyLink:
    """What a run needs of a proxy: its URL, black hole on and off, reset, close.

    :param proxy: the started proxy
    """

    def __init__(self, proxy: Any) -> None:
        self.proxy = proxy
        self.reach = 0  # jobs the proxied worker can hold (set by the run)

    @property
    def url(self) -> str:
        url: str = self.proxy.url
        return url

    def blackhole(self) -> None:
        self.proxy.blackhole()

    def heal(self) -> None:
        self.proxy.heal()

    def reset(self) -> None:
        self.proxy.reset()

    def close(self) -> None:
        self.proxy.close()


def open_proxy(target_port: int) -> tuple[ProxyLink | None, str]:
    """A started proxy to ``127.0.0.1:target_port``, or None and the reason there is none."""
    try:
        module = importlib.import_module("conveyor.faults.proxy")
    except ImportError:
        return None, "conveyor.faults.proxy is not available"
    proxy = module.Proxy(("127.0.0.1", target_port))
    proxy.start()
    return ProxyLink(proxy), ""
