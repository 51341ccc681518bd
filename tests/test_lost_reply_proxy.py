"""The proxy's lost-reply fault, against a real redis-server: a chosen request reaches
Redis and is executed, then its reply is dropped and the client's connection reset, so the
client sees ``ConnectionError`` for a command that took effect. Other requests pass."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from conveyor.faults.proxy import Proxy, _describe, _request_end, _value_end
from helpers import RedisServer


@pytest.fixture
def proxy(redis_server: RedisServer) -> Iterator[Proxy]:
    with Proxy(("127.0.0.1", redis_server.port)) as started:
        yield started


@pytest.fixture
def key() -> str:
    return f"lost:{uuid.uuid4().hex[:10]}"


def through(proxy: Proxy, **options: object) -> redis.Redis:
    """A client through the proxy that never re-sends a command on its own: redis-py's
    default retries would send the INCR again and hide the lost reply."""
    return redis.Redis(port=proxy.port, socket_timeout=5, retry=Retry(NoBackoff(), 0),
                       **options)  # type: ignore[arg-type]


def test_an_incr_whose_reply_is_lost_raises_yet_was_applied(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    client, direct = through(proxy), redis_server.client()
    assert client.set(f"{key}:other", "x")
    rule = proxy.lose_replies(match=b"INCR", count=1)
    assert client.get(f"{key}:other") == b"x"  # not an INCR: passes
    with pytest.raises(redis.exceptions.ConnectionError):
        client.incr(key)
    assert direct.get(key) == b"1"  # Redis applied it
    assert rule.wait(1) and (rule.chosen, rule.lost, rule.missed) == (1, 1, 0)
    assert rule.requests == [b"INCRBY " + key.encode()]  # redis-py sends INCR as INCRBY
    assert proxy.lost == 1
    assert client.incr(key) == 2  # the rule is spent: the next one passes, on a new connection
    assert client.get(f"{key}:other") == b"x"


def test_lose_next_reply_takes_any_request_and_only_one(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    client = through(proxy)
    assert client.ping()
    proxy.lose_next_reply()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.set(key, "v")
    assert redis_server.client().get(key) == b"v"
    assert client.get(key) == b"v"


def test_a_count_and_a_predicate_choose_the_requests(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    client = through(proxy)
    rule = proxy.lose_replies(match=lambda request: f"{key}:b".encode() in request, count=2)
    for _ in range(2):
        assert client.rpush(f"{key}:a", "x")  # does not match: passes
        with pytest.raises(redis.exceptions.ConnectionError):
            client.rpush(f"{key}:b", "y")
    assert client.rpush(f"{key}:b", "y") == 3  # both lost replies were applied; count spent
    assert rule.wait(1) and rule.lost == 2 and not rule.active
    assert redis_server.client().llen(f"{key}:a") == 2


def test_a_script_call_is_applied_and_its_reply_lost(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    client = through(proxy)
    sha = client.script_load("return redis.call('INCRBY', KEYS[1], ARGV[1])")
    assert client.evalsha(sha, 1, key, 5) == 5
    rule = proxy.lose_replies(match=b"EVALSHA", count=1)
    with pytest.raises(redis.exceptions.ConnectionError):
        client.evalsha(sha, 1, key, 5)
    assert redis_server.client().get(key) == b"10"
    assert rule.requests == [b"EVALSHA " + sha.encode()]


def test_heal_and_cancel_stop_a_rule(proxy: Proxy, key: str) -> None:
    client = through(proxy)
    rule = proxy.lose_replies(match=b"INCR", count=None)  # every INCR, until stopped
    with pytest.raises(redis.exceptions.ConnectionError):
        client.incr(key)
    with pytest.raises(redis.exceptions.ConnectionError):
        client.incr(key)
    proxy.heal()
    assert client.incr(key) == 3
    assert rule.lost == 2 and not rule.active
    other = proxy.lose_replies(match=b"INCR", count=1)
    other.cancel()
    assert client.incr(key) == 4 and other.chosen == 0


def test_the_replies_of_a_pipeline_before_and_after_the_chosen_request(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    """A pipeline is one exchange: every request of it is executed, the client sees it
    fail as a whole."""
    client = through(proxy)
    proxy.lose_replies(match=b"INCR", count=1)
    with pytest.raises(redis.exceptions.ConnectionError), \
            client.pipeline(transaction=False) as pipe:
        pipe.set(f"{key}:before", 1).incr(key).set(f"{key}:after", 1).execute()
    direct = redis_server.client()
    assert direct.mget(f"{key}:before", key, f"{key}:after") == [b"1", b"1", b"1"]


def test_a_transaction_loses_the_reply_of_its_exec(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    client = through(proxy)
    proxy.lose_replies(match=b"EXEC", count=1)
    with pytest.raises(redis.exceptions.ConnectionError), \
            client.pipeline(transaction=True) as pipe:
        pipe.incr(key).incr(key).execute()
    assert redis_server.client().get(key) == b"2"


def test_large_and_nested_replies_pass_whole_before_the_chosen_one(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    """Replies bigger than a chunk, RESP3 maps and nulls are found whole: the proxy drops
    exactly the chosen request's reply."""
    direct = redis_server.client()
    big = [b"x" * 1000 + str(i).encode() for i in range(300)]  # ~300 KB: many chunks
    direct.rpush(f"{key}:big", *big)
    direct.hset(f"{key}:h", mapping={"a": "1", "b": "2"})
    for protocol in (2, 3):
        client = through(proxy, protocol=protocol)
        proxy.lose_replies(match=f"{key}:n".encode(), count=1)
        assert client.lrange(f"{key}:big", 0, -1) == big
        assert client.hgetall(f"{key}:h") == {b"a": b"1", b"b": b"2"}
        assert client.get(f"{key}:missing") is None
        with pytest.raises(redis.exceptions.ConnectionError):
            client.incr(f"{key}:n")
        assert client.lrange(f"{key}:big", 0, 1) == big[:2]
    assert direct.get(f"{key}:n") == b"2"


def test_a_blocking_command_loses_the_reply_it_finally_gets(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    client = through(proxy)
    rule = proxy.lose_replies(match=b"BLPOP", count=1)
    threading.Timer(0.3, lambda: redis_server.client().rpush(key, "job")).start()
    began = time.monotonic()
    with pytest.raises(redis.exceptions.ConnectionError):
        client.blpop([key], timeout=3)
    assert 0.25 < time.monotonic() - began < 2.5
    assert redis_server.client().llen(key) == 0  # the item was popped: it is gone
    assert rule.lost == 1


def test_an_asyncio_client_sees_a_connection_error(
        proxy: Proxy, redis_server: RedisServer, key: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis(port=proxy.port, socket_timeout=5,
                                     retry=Retry(NoBackoff(), 0))
        try:
            proxy.lose_replies(match=b"INCR", count=1)
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.incr(key)
            assert await client.incr(key) == 2
        finally:
            await client.aclose()

    asyncio.run(main())
    assert redis_server.client().get(key) == b"2"


def test_a_subscribed_connection_is_forwarded_untouched(proxy: Proxy, key: str) -> None:
    """Pub/sub breaks one reply per request: such a connection loses no reply."""
    client = through(proxy)
    pubsub = client.pubsub()
    pubsub.subscribe(key)
    rule = proxy.lose_replies(match=key.encode(), count=1)
    assert pubsub.get_message(timeout=1)["type"] == "subscribe"  # type: ignore[index]
    pubsub.close()
    assert rule.chosen == 0
    with pytest.raises(redis.exceptions.ConnectionError):
        client.publish(key, "hello")  # a paired connection: chosen
    assert rule.lost == 1


def test_a_chosen_request_whose_server_goes_away_is_missed(
        make_server: type[RedisServer], key: str) -> None:
    server = make_server().start()
    with Proxy(("127.0.0.1", server.port)) as proxy:
        client = through(proxy)
        assert client.ping()
        rule = proxy.lose_replies(match=b"BLPOP", count=1)
        threading.Timer(0.3, server.stop).start()
        with pytest.raises(redis.exceptions.ConnectionError):
            client.blpop([key], timeout=5)
        assert rule.wait(2) and (rule.lost, rule.missed) == (0, 1)


def test_a_target_function_is_asked_at_each_connection(
        redis_server: RedisServer, make_server: type[RedisServer], key: str) -> None:
    other = make_server().start()
    targets = [redis_server.port]
    with Proxy(lambda: ("127.0.0.1", targets[-1])) as proxy:
        client = through(proxy)
        client.set(key, "first")
        targets.append(other.port)
        proxy.reset()  # what a balancer does when the server behind it changes
        assert client.get(key) is None  # the pool reconnects: to the other server
        assert client.set(key, "second")
    assert redis_server.client().get(key) == b"first"
    assert other.client().get(key) == b"second"


def test_the_protocol_reader_finds_ends_and_waits_for_the_rest() -> None:
    whole = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n%1\r\n+a\r\n*2\r\n:1\r\n_\r\n"
    assert _value_end(whole, 0) == len(whole)
    for cut in range(1, len(whole)):
        assert _value_end(whole[:cut], 0) == -1
    assert _value_end(b"$-1\r\n*-1\r\n", 0) == 5
    assert _value_end(b"|1\r\n+k\r\n+v\r\n:7\r\n", 0) == 16  # an attribute and its value
    with pytest.raises(ValueError):
        _value_end(b"?what\r\n", 0)
    assert _request_end(b"PING\r\nECHO x\r\n", 0) == 6
    assert _describe(b"*3\r\n$7\r\nEVALSHA\r\n$3\r\nabc\r\n$1\r\n0\r\n") == b"EVALSHA abc"
    assert _describe(b"incr k\r\n") == b"incr k"
