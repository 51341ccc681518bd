"""A private Redis Sentinel set on loopback: a primary and a replica (both with the settings
conveyor's promises assume: ``appendonly yes``, ``appendfsync always``, ``noeviction``)
and three sentinels, run from the same ``redis-server`` binary with ``--sentinel`` and a
writable config file in the set's folder.

A Sentinel failover alone is not safe for acknowledged writes: ``SENTINEL FAILOVER``
promotes the replica with ``REPLICAOF NO ONE`` without waiting for it to have everything
the primary acknowledged, and the old primary keeps taking writes until it is demoted
(Sentinel does that some seconds later). Those writes are lost. :meth:`SentinelSet.failover`
therefore does what an operator does for a planned failover, which is also what Redis's
own ``FAILOVER`` command does on a single pair: it pauses writes on the primary (``CLIENT
PAUSE ... WRITE``), waits until the replica has caught up with the primary's replication
offset, has the sentinels fail over, demotes the old primary to a replica of the new one
and only then lifts the pause. The writes held by the pause are then refused with
``READONLY`` and go to the new primary when the clients try again.

An unplanned failover (the primary found dead by the sentinels) can lose the last writes
the primary acknowledged, whatever the client does; so while the primary is down on
purpose, or writes are paused, :meth:`SentinelSet.holding` raises the sentinels'
down-after period, and they wait for it instead of promoting the replica.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

from .servers import START_TIMEOUT, RedisProcess, free_port

__all__ = ["SERVICE", "SentinelSet"]

SERVICE = "mymaster"
HELD_DOWN_AFTER_MS = 600_000  # while holding: the sentinels never find the primary down
PAUSE_MS = 30_000  # longest a failover may hold writes (lifted as soon as it is done)
SETTLE_TIMEOUT = 30.0  # seconds for the sentinels to agree after a change
PROMOTABLE_TIMEOUT = 10.0  # seconds a failover waits for the replica to be in sync
# Failovers closer together than this are not asked for: back-to-back forced failovers
# (every few seconds) sometimes left a sentinel naming the old primary for more than
# SETTLE_TIMEOUT, which a production set never meets and which tests nothing of conveyor.
FAILOVER_GAP = 10.0


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` (Redis errors count as not yet) until it holds."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.exceptions.RedisError, OSError):
            if condition():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)


def _info(server: RedisProcess, section: str) -> dict[str, Any]:
    client = server.client(socket_timeout=5)
    try:
        info: dict[str, Any] = client.info(section)
        return info
    finally:
        client.close()


def _named_port(sentinel: redis.Redis) -> int:
    address: Any = sentinel.sentinel_get_master_addr_by_name(SERVICE)
    return int(address[1])


class SentinelSet:
    """A primary, a replica and three sentinels.

    :param binary: path of ``redis-server``
    :param folder: the set's folder (one sub-folder per server, the sentinels' configs)
    :param down_after_ms: the sentinels' ``down-after-milliseconds``
    :param failover_timeout_ms: the sentinels' ``failover-timeout``
    """

    fails_over = True

    def __init__(self, binary: str, folder: Path, down_after_ms: int = 5000,
                 failover_timeout_ms: int = 10_000) -> None:
        self.binary = binary
        self.folder = folder
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.servers = (RedisProcess(binary, folder / "redis-a", durable=True),
                        RedisProcess(binary, folder / "redis-b", durable=True))
        self.servers[1].replica_of = self.servers[0].port
        self.ports = [free_port() for _ in range(3)]
        self.processes: list[subprocess.Popen[bytes]] = []
        self.failovers = 0
        self._last_failover = -FAILOVER_GAP  # monotonic time of the latest one

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL of the service, database 0."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    # -- processes -------------------------------------------------------------------------

    def start(self) -> SentinelSet:
        for server in self.servers:
            server.start()
        _wait(lambda: self._linked(self.servers[1]), START_TIMEOUT, "the replica in sync")
        for i, port in enumerate(self.ports):
            conf = self.folder / f"sentinel{i}.conf"
            conf.write_text("\n".join([
                f"port {port}", "bind 127.0.0.1", f"dir {self.folder}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.servers[0].port} 2",
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}",
                f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}",
                f"sentinel parallel-syncs {SERVICE} 1", "",
            ]))
            self.processes.append(subprocess.Popen(
                [self.binary, str(conf), "--sentinel",
                 "--logfile", str(self.folder / f"sentinel{i}.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL))
        _wait(self._sentinels_ready, SETTLE_TIMEOUT,
              "the sentinels to see the replica and each other")
        return self

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.processes = []
        for server in self.servers:
            server.stop()

    # -- what the sentinels say ------------------------------------------------------------

    def sentinel(self, i: int = 0) -> redis.Redis:
        return redis.Redis(port=self.ports[i], socket_timeout=5)

    def _ask(self, question: Callable[[redis.Redis], Any]) -> list[Any]:
        answers = []
        for i in range(len(self.ports)):
            client = self.sentinel(i)
            try:
                answers.append(question(client))
            finally:
                client.close()
        return answers

    def _sentinels_ready(self) -> bool:
        states = self._ask(lambda s: s.sentinel_master(SERVICE))
        return all(int(st["num-slaves"]) >= 1 and int(st["num-other-sentinels"]) >= 2
                   for st in states)

    def primary_port(self) -> int:
        """The primary's port as the first sentinel names it."""
        client = self.sentinel(0)
        try:
            return _named_port(client)
        finally:
            client.close()

    def primary(self) -> RedisProcess:
        """The server the sentinels name as primary."""
        port = self.primary_port()
        return next(s for s in self.servers if s.port == port)

    def replica(self) -> RedisProcess:
        port = self.primary_port()
        return next(s for s in self.servers if s.port != port)

    def _agreed(self, port: int) -> bool:
        named = self._ask(_named_port)
        return all(p == port for p in named)

    def _linked(self, replica: RedisProcess) -> bool:
        return _info(replica, "replication").get("master_link_status") == "up"

    def _promotable(self, replica: RedisProcess) -> bool:
        """``replica`` is linked to the primary and every sentinel knows it as a healthy
        replica (else SENTINEL FAILOVER would answer NOGOODSLAVE). The sentinels' own view
        of its link lags by up to their 10 s INFO period; the replica's INFO is current."""
        def fine(s: redis.Redis) -> bool:
            return any(int(r["port"]) == replica.port and r["flags"] == "slave"
                       for r in s.sentinel_slaves(SERVICE))
        return self._linked(replica) and all(self._ask(fine))

    def _seen_up(self) -> bool:
        """Every sentinel had a PING answered by the primary within the last second."""
        states = self._ask(lambda s: s.sentinel_master(SERVICE))
        return all(st.get("is_master") and not st.get("is_sdown")
                   and int(st["last-ok-ping-reply"]) < 1000 for st in states)

    # -- faults ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """No automatic failover inside the block: the sentinels' down-after period is
        raised, and restored only once they all see the primary answer again."""
        self._ask(lambda s: s.sentinel_set(SERVICE, "down-after-milliseconds",
                                           HELD_DOWN_AFTER_MS))
        try:
            yield
        finally:
            _wait(self._seen_up, SETTLE_TIMEOUT, "the sentinels to see the primary up")
            self._ask(lambda s: s.sentinel_set(SERVICE, "down-after-milliseconds",
                                               self.down_after_ms))

    def crash(self, hold: Callable[[], float]) -> str:
        """SIGKILL the primary, wait ``hold()``, start it again (from its append-only file)
        in its role; the sentinels keep it primary."""
        with self.holding():
            primary = self.primary()
            primary.kill()
            try:
                seconds = hold()
            finally:
                primary.start()
        return f"primary :{primary.port} down {seconds:g} s"

    def failover(self, pause_writes: bool = True) -> str | None:
        """``SENTINEL FAILOVER``, coordinated (see the module's docstring) unless
        ``pause_writes`` is false (then as Sentinel alone does it: the old primary takes
        writes until the sentinels demote it); None when the replica cannot be promoted
        right now (still syncing after ``PROMOTABLE_TIMEOUT``) or the last failover was
        less than ``FAILOVER_GAP`` ago. Returns what happened."""
        if time.monotonic() - self._last_failover < FAILOVER_GAP:
            return None  # too soon after the last one: asked again later
        with self.holding():
            old, new = self.primary(), self.replica()
            try:
                _wait(lambda: self._promotable(new), PROMOTABLE_TIMEOUT, "a promotable replica")
            except RuntimeError:
                return None  # still resyncing after a restart: try again later
            admin = old.client()
            began = time.monotonic()
            try:
                if pause_writes:
                    admin.client_pause(PAUSE_MS, all=False)  # writes only
                try:
                    done = self._promote(old, new, admin if pause_writes else None)
                finally:
                    if pause_writes:
                        admin.client_unpause()
            finally:
                admin.close()
            paused = time.monotonic() - began
        if not done:
            return None
        self.failovers += 1
        self._last_failover = time.monotonic()
        held = f", writes paused {paused:.1f} s" if pause_writes else ""
        return f"primary :{old.port} -> :{new.port}{held}"

    def _promote(self, old: RedisProcess, new: RedisProcess, admin: redis.Redis | None
                 ) -> bool:
        """Fail over to ``new``; with ``admin`` (a client of the paused old primary) wait
        for the replica to catch up first and demote the old primary at the end."""
        def caught_up() -> bool:
            assert admin is not None
            wanted = int(admin.info("replication")["master_repl_offset"])
            return int(_info(new, "replication")["master_repl_offset"]) >= wanted

        if admin is not None:
            _wait(caught_up, SETTLE_TIMEOUT, "the replica to catch up")
        client = self.sentinel(0)
        try:
            client.sentinel_failover(SERVICE)
        except redis.exceptions.ResponseError:
            return False  # NOGOODSLAVE or INPROG: nothing changed
        finally:
            client.close()
        _wait(lambda: self._agreed(new.port)
              and _info(new, "replication")["role"] == "master", SETTLE_TIMEOUT,
              "every sentinel to name the new primary")
        if admin is not None:
            # Demoted before the pause ends: the writes it held are refused, never applied.
            admin.replicaof("127.0.0.1", new.port)
        # (Without: the sentinels demote it themselves some seconds later.)
        new.replica_of, old.replica_of = None, new.port
        return True
