"""A real Sentinel set for tests: a primary, a replica and three sentinels on free ports.

Sentinels run from the same redis-server binary (``--sentinel``) with a writable config
file in the set's own folder. Short down-after and failover timeouts make a failover take
a second or two.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import redis

from helpers import REDIS_SERVER, RedisServer, free_port, wait_until

SERVICE = "mymaster"


class SentinelSet:
    """Primary + replica + three sentinels; :meth:`failover` promotes the replica."""

    def __init__(self) -> None:
        self.primary = RedisServer(durable=True)
        self.replica = RedisServer(durable=True)
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-sentinel-"))
        self.ports = [free_port() for _ in range(3)]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelSet:
        self.primary.start()
        self.replica.extra = ["--replicaof", "127.0.0.1", str(self.primary.port)]
        self.replica.start()
        wait_until(lambda: self.replica.client().info("replication").get(
            "master_link_status") == "up", 10, message="the replica in sync")
        for i, port in enumerate(self.ports):
            conf = self.dir / f"sentinel{i}.conf"
            conf.write_text("\n".join([
                f"port {port}", "bind 127.0.0.1", f"dir {self.dir}",
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2",
                f"sentinel down-after-milliseconds {SERVICE} 1000",
                f"sentinel failover-timeout {SERVICE} 5000",
                f"sentinel parallel-syncs {SERVICE} 1", "",
            ]))
            self.processes.append(subprocess.Popen(
                [REDIS_SERVER, str(conf), "--sentinel", "--logfile", str(self.dir / f"s{i}.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until(self._sentinels_know_the_replica, 20, 0.1, "sentinels to see the replica")
        return self

    def sentinel(self, i: int = 0) -> redis.Redis:
        return redis.Redis(port=self.ports[i], socket_timeout=5)

    def _sentinels_know_the_replica(self) -> bool:
        try:
            return all(len(self.sentinel(i).sentinel_slaves(SERVICE)) >= 1 for i in range(3))
        except redis.exceptions.RedisError:
            return False

    def primary_port(self) -> int:
        return int(self.sentinel().sentinel_get_master_addr_by_name(SERVICE)[1])

    def failover(self) -> None:
        """Promote the replica (SENTINEL FAILOVER) and wait until the sentinels name it and
        it accepts writes."""
        old = self.primary_port()
        self.sentinel().sentinel_failover(SERVICE)
        wait_until(lambda: self.primary_port() != old, 20, 0.05, "a new primary")
        new = RedisServer.__new__(RedisServer)
        new.port = self.primary_port()
        wait_until(lambda: new.client().info("replication")["role"] == "master", 10, 0.05,
                   "the new primary to take writes")

    def cleanup(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait(5)
        self.replica.cleanup()
        self.primary.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)
