"""The 3,999-argument limit, held on the server's side: every client of these tests reaches
Redis through a proxy that refuses, with an error reply, any command of more than
MAX_COMMAND_ARGS words, as an engine with that limit does. No Redis or Valkey setting
refuses a command by its number of arguments (a query buffer limit counts bytes), so the
proxy stands in for such an engine. A large bulk enqueue, a large workflow and a worker
draining a large backlog must all succeed through it, with nothing refused (but the probe
of `conveyor doctor`, which a worker runs at its start), and the longest
command it saw shows that they came close to the limit."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator

import pytest
import redis

import conveyor
from conveyor.faults.proxy import Proxy, _Link, _request_end, _words
from conveyor.scripts import MAX_COMMAND_ARGS, source
from helpers import RedisServer, running_worker, wait_until


class ArgumentLimitProxy(Proxy):
    """A :class:`~conveyor.faults.proxy.Proxy` that forwards whole requests only, and sends a
    request of more than ``most`` words on as a script that answers with an error: Redis
    then replies to it in its place among the connection's replies, so pipelined requests
    keep their order without the proxy pairing replies itself.

    :ivar longest: the most words any request passed on carried
    :ivar refused: the word count of each refused request
    :ivar refused_heads: the first 300 bytes of each refused request
    :ivar by_script: the most words a call of each script (by SHA) carried
    """

    def __init__(self, target: tuple[str, int], most: int = MAX_COMMAND_ARGS) -> None:
        super().__init__(target)
        self.most = most
        self.longest = 0
        self.refused: list[int] = []
        self.refused_heads: list[bytes] = []
        self.by_script: dict[str, int] = {}  # script SHA -> most words a call of it carried
        self._counted = threading.Lock()

    def _requests(self, link: _Link, data: bytes) -> None:
        link.paired = False  # replies pass through untouched: see the class docstring
        buf = link.requests
        buf += data
        pos, out = 0, bytearray()
        while (end := _request_end(buf, pos)) >= 0:
            out += self._checked(bytes(buf[pos:end]))
            pos = end
        del buf[:pos]
        if out:
            link.upstream.sendall(out)

    def refused_other(self) -> list[bytes]:
        """The refused requests (their start), but for the doctor's probe at a worker's
        start: an EXISTS of 4,000 keys, which asks whether the server has the limit."""
        return [head for head in self.refused_heads if b"EXISTS" not in head[:20]]

    def _checked(self, request: bytes) -> bytes:
        words = (int(request[1:request.index(b"\r\n")]) if request.startswith(b"*")
                 else len(request.split()))
        with self._counted:
            if words <= self.most:
                self.longest = max(self.longest, words)
                command = _words(request, 2)
                if command and command[0].upper() == b"EVALSHA":
                    sha = command[1].decode()
                    self.by_script[sha] = max(self.by_script.get(sha, 0), words)
                return request
            self.refused.append(words)
            self.refused_heads.append(request[:300])
        error = (f"return redis.error_reply('ERR a command of {words} arguments: at most"
                 f" {self.most} are taken')")
        return b"".join([b"*3\r\n$4\r\nEVAL\r\n", b"$%d\r\n%s\r\n" % (len(error), error.encode()),
                         b"$1\r\n0\r\n"])


def sha(script: str) -> str:
    """The SHA a call of ``script`` names (EVALSHA)."""
    return hashlib.sha1(source(script).encode()).hexdigest()


@pytest.fixture
def limited(make_server: type[RedisServer]) -> Iterator[tuple[conveyor.Conveyor,
                                                                ArgumentLimitProxy]]:
    server = make_server().start()
    proxy = ArgumentLimitProxy(("127.0.0.1", server.port)).start()
    app = conveyor.Conveyor(proxy.url, namespace="limited")
    yield app, proxy
    app.close()
    proxy.close()


def test_the_proxy_refuses_a_command_of_4000_words_and_passes_3999(
        limited: tuple[conveyor.Conveyor, ArgumentLimitProxy]) -> None:
    _, proxy = limited
    client = redis.Redis(port=proxy.port)
    keys = [f"{{t}}k{i}" for i in range(MAX_COMMAND_ARGS)]
    with client.pipeline(transaction=False) as pipe:  # in order, each with its own reply
        pipe.exists(*keys[:-1])  # 3,999 words with EXISTS
        pipe.exists(*keys)
        pipe.ping()
        replies = pipe.execute(raise_on_error=False)
    assert replies[0] == 0 and replies[2] is True
    assert isinstance(replies[1], redis.ResponseError)
    assert "a command of 4000 arguments: at most 3999" in str(replies[1])
    assert proxy.refused == [4000]
    client.close()


def test_a_bulk_enqueue_of_10000_jobs_is_taken(
        limited: tuple[conveyor.Conveyor, ArgumentLimitProxy]) -> None:
    app, proxy = limited

    @app.task
    def add(x: int) -> int:
        return x

    jobs = add.enqueue_many(range(10_000))
    assert len({j.id for j in jobs}) == 10_000
    assert int(app.redis.hget(app.keys("default").counts, "ready")) == 10_000
    assert proxy.refused_other() == []
    assert MAX_COMMAND_ARGS - 10 < proxy.longest <= MAX_COMMAND_ARGS


def test_a_workflow_of_2000_nodes_is_stored_and_runs(
        limited: tuple[conveyor.Conveyor, ArgumentLimitProxy]) -> None:
    app, proxy = limited

    @app.task
    def node(i: int) -> int:
        return i

    wf = app.workflow()
    root = wf.add(node, -1, name="root")
    middle = [wf.add(node, i, name=f"n{i}", after=[root]) for i in range(1998)]
    wf.add(node, -2, name="fanin", after=middle)
    handle = wf.enqueue()
    assert len(handle.info().nodes) == 2000
    with running_worker(app, concurrency=64):
        wait_until(lambda: handle.info().state != "running", 120, 0.2, "the workflow's end")
    assert handle.info().counts == {"succeeded": 2000}
    assert proxy.refused_other() == []
    assert MAX_COMMAND_ARGS - 20 < proxy.longest <= MAX_COMMAND_ARGS


def test_a_worker_of_concurrency_1000_drains_a_backlog_of_6000_jobs(
        limited: tuple[conveyor.Conveyor, ArgumentLimitProxy]) -> None:
    app, proxy = limited

    @app.task
    async def work(x: int) -> int:
        return x * 2

    jobs = work.enqueue_many(range(6_000))
    counts = app.keys("default").counts
    # A concurrency above what one finish call carries (660 outcomes), on a slow link:
    # outcomes gather faster than they are recorded.
    proxy.delay(0.02)
    with running_worker(app, concurrency=1000):
        wait_until(lambda: int(app.redis.hget(counts, "ready") or 0) == 0
                   and app.monitor.active(work.name) == 0, 120, 0.2, "the backlog drained")
    assert {job.info().state for job in jobs[::97]} == {conveyor.JobState.SUCCEEDED}
    assert app.monitor.stats(task=work.name).succeeded == 6_000
    assert proxy.refused_other() == []
    # Outcomes gathered past what one finish call carries: they went in full calls.
    assert MAX_COMMAND_ARGS - 10 < proxy.by_script[sha("finish")] <= MAX_COMMAND_ARGS
