"""TLS to Redis: every part of conveyor (producers, thread and process workers, the CLI, the
dashboard, the SQL sink) over a TLS-only redis-server, with and without client
certificates, and what a wrong certificate looks like: a quick, clear error, never a hang.

The certificates are made per module by :func:`tls_helpers.make_certificates`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

import conveyor
from conveyor import clients
from conveyor.unreachable import describe
from conveyor.urls import public_url, split_tls, with_tls
from helpers import (
    CONVEYOR,
    TESTS,
    RedisCluster,
    WorkerProcesses,
    env_with_src,
    run_async,
    running_worker,
    stop_processes,
    wait_until,
)
from tls_helpers import Certificates, TLSRedisServer, TLSSentinel, make_certificates

FAILS_WITHIN = 5.0  # seconds a refused TLS connection may take to say so


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_server(certs: Certificates) -> Iterator[TLSRedisServer]:
    """A TLS-only server that asks for no client certificate."""
    server = TLSRedisServer(certs).start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def mtls_server(certs: Certificates) -> Iterator[TLSRedisServer]:
    """A TLS-only server that requires a client certificate its CA signed."""
    server = TLSRedisServer(certs, require_client_cert=True).start()
    yield server
    server.cleanup()


def make_app(url: str, **options: Any) -> conveyor.Conveyor:
    app = conveyor.Conveyor(url, namespace=f"tls{uuid.uuid4().hex[:8]}", **options)

    @app.task(name="add")
    def add(x: int, y: int) -> int:
        return x + y

    @app.task(name="aadd")
    async def aadd(x: int, y: int) -> int:
        await asyncio.sleep(0)
        return x + y

    return app


@pytest.fixture
def mtls_app(mtls_server: TLSRedisServer) -> Iterator[conveyor.Conveyor]:
    app = make_app(mtls_server.url)
    yield app
    app.close()


# -- options ---------------------------------------------------------------------------------


def test_tls_options_are_typed_and_reach_sync_and_async_clients(certs: Certificates) -> None:
    url = f"rediss://127.0.0.1:1/0?ssl_ca_certs={certs.ca}&ssl_check_hostname=false" \
          "&ssl_cert_reqs=Required&client_name=me"
    rest, tls = split_tls(url)
    assert rest == "rediss://127.0.0.1:1/0?client_name=me"
    assert tls == {"ssl_ca_certs": str(certs.ca), "ssl_check_hostname": False,
                   "ssl_cert_reqs": "required"}
    sync = clients.sync_client(url)
    try:
        kwargs = sync.connection_pool.connection_kwargs
        assert kwargs["ssl_check_hostname"] is False and kwargs["client_name"] == "me"
        assert kwargs["ssl_ca_certs"] == str(certs.ca)
        assert sync.connection_pool.connection_class is redis.SSLConnection
    finally:
        sync.close()

    async def async_kwargs() -> dict[str, Any]:
        client = clients.async_client(url)
        try:
            assert client.connection_pool.connection_class is redis.asyncio.SSLConnection
            return dict(client.connection_pool.connection_kwargs)
        finally:
            await client.aclose()

    kwargs = asyncio.run(async_kwargs())
    assert kwargs["ssl_check_hostname"] is False and kwargs["ssl_ca_certs"] == str(certs.ca)


def test_ssl_keyword_is_added_to_the_url_and_refused_without_tls(certs: Certificates) -> None:
    app = conveyor.Conveyor("rediss://127.0.0.1:1/0",
                            ssl={"ca_certs": certs.ca, "check_hostname": True,
                                 "cert_reqs": ssl.CERT_REQUIRED, "password": "s3cret"})
    assert split_tls(app.url)[1] == {"ssl_ca_certs": str(certs.ca), "ssl_check_hostname": True,
                                     "ssl_cert_reqs": "required", "ssl_password": "s3cret"}
    assert "s3cret" not in public_url(app.url) and "ssl_password=***" in public_url(app.url)
    assert "s3cret" not in repr(app)
    refusals = [
        (lambda: conveyor.Conveyor("redis://127.0.0.1:1/0", ssl={"ca_certs": "ca.pem"}),
         "ssl= needs a TLS URL"),
        (lambda: conveyor.Conveyor("redis+cluster://127.0.0.1:1/0", ssl={}),
         "ssl= needs a TLS URL"),
        (lambda: conveyor.Conveyor("rediss://127.0.0.1:1/0", ssl={"cafile": "ca.pem"}),
         "unknown ssl option 'cafile'"),
        (lambda: conveyor.Conveyor("rediss://127.0.0.1:1/0", ssl=ssl.create_default_context()),
         "takes a dict"),
        (lambda: with_tls("rediss://h:1/0?ssl_ca_certs=a.pem", {"ca_certs": "b.pem"}),
         "both by ssl= and in the URL"),
        (lambda: conveyor.Conveyor("redis://127.0.0.1:1/0?ssl_ca_certs=ca.pem"),
         "need a TLS scheme"),
        (lambda: conveyor.Conveyor("rediss://127.0.0.1:1/0?ssl_check_hostname=maybe"),
         "ssl_check_hostname: 'maybe'"),
        (lambda: conveyor.Conveyor("rediss://127.0.0.1:1/0?ssl_cafile=ca.pem"),
         "unknown TLS option 'ssl_cafile'"),
    ]
    for make, says in refusals:
        with pytest.raises(ValueError, match=says):
            make()


# -- everything over TLS ---------------------------------------------------------------------


@pytest.mark.parametrize("how", ["url", "keyword"])
def test_jobs_run_over_mutual_tls(mtls_server: TLSRedisServer, certs: Certificates,
                                  how: str) -> None:
    """Sync and async producers, and a worker in a thread, with the options in the URL or
    given as ``ssl=``; the worker's own wake listener uses them too (a job enqueued after
    it started is taken at once)."""
    if how == "url":
        app = make_app(mtls_server.url)
    else:
        app = make_app(mtls_server.bare_url, ssl={
            "ca_certs": certs.ca, "certfile": certs.client_cert, "keyfile": certs.client_key})
    add, aadd = app.tasks["add"], app.tasks["aadd"]
    try:
        early = add.enqueue(1, 2)

        async def produce() -> Any:
            return await aadd.aenqueue(3, 4)

        async_job = run_async(app, produce())
        with running_worker(app, concurrency=4):
            assert early.result(timeout=10) == 3
            assert async_job.result(timeout=10) == 7
            began = time.monotonic()
            assert add.enqueue(5, 6).result(timeout=10) == 11
            assert time.monotonic() - began < 2  # woken, not found by a slow poll

            async def consume() -> Any:
                return await (await aadd.aenqueue(1, 1)).aresult(timeout=10)

            assert run_async(app, consume()) == 2
    finally:
        app.close()


def test_a_worker_process_runs_jobs_over_mutual_tls(mtls_server: TLSRedisServer,
                                                    tmp_path: Path) -> None:
    """``conveyor worker`` with the TLS URL in ``CONVEYOR_REDIS_URL``."""
    import running_app

    app = running_app.make_app(mtls_server.url, f"tls{uuid.uuid4().hex[:8]}")
    processes = WorkerProcesses(app, tmp_path, "running_app:app", "RUNNING_APP_NAMESPACE",
                                ("-c", "2"))
    try:
        processes.start()
        jobs = [app.tasks["hold"].enqueue(f"t{i}", 0) for i in range(5)]
        assert [job.result(timeout=30) for job in jobs] == ["held"] * 5, processes.logs()
    finally:
        processes.stop()
        app.close()


def test_cli_reads_over_mutual_tls(mtls_app: conveyor.Conveyor) -> None:
    mtls_app.tasks["add"].enqueue_many([(i, i) for i in range(3)])
    done = subprocess.run([CONVEYOR, "stats", "--json", "--url", mtls_app.url,
                           "--namespace", mtls_app.namespace],
                          env=env_with_src(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["total"]["backlog"]["ready"] == 3
    done = subprocess.run([CONVEYOR, "info", "--url", mtls_app.url,
                           "--namespace", mtls_app.namespace],
                          env=env_with_src(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_dashboard_serves_its_overview_over_mutual_tls(mtls_app: conveyor.Conveyor) -> None:
    from starlette.testclient import TestClient

    from conveyor.web import create_app

    mtls_app.tasks["add"].enqueue_many([(i, i) for i in range(4)])
    with TestClient(create_app(mtls_app, cache_seconds=0)) as client:
        data = client.get("/api/overview").json()
        row = next(q for q in data["queues"] if q["name"] == "default")
        assert row["ready"] == 4
        assert client.get("/").status_code == 200


def test_sink_records_jobs_over_mutual_tls(mtls_app: conveyor.Conveyor, tmp_path: Path) -> None:
    from conveyor.sink import Sink

    jobs = mtls_app.tasks["add"].enqueue_many([(i, 1) for i in range(6)])
    sink = Sink(mtls_app, f"sqlite:///{tmp_path / 'jobs.db'}", table="jobs", consumer="c1")
    try:
        assert sink.run(until_idle=True) == 0  # turns the queue's event stream on
        with running_worker(mtls_app, concurrency=4):
            assert [job.result(timeout=10) for job in jobs] == [i + 1 for i in range(6)]
        assert sink.run(until_idle=True) == 6
        with sink.engine.connect() as conn:
            ids = {row.job_id for row in conn.execute(sink.table.select())}
        assert ids == {job.id for job in jobs}
    finally:
        sink.close()


# -- wrong certificates ----------------------------------------------------------------------


def refusal(url: str) -> tuple[BaseException, BaseException]:
    """What a sync and an async PING through conveyor's clients raise for ``url``, each
    within :data:`FAILS_WITHIN` seconds."""
    app = conveyor.Conveyor(url)
    raised: list[BaseException] = []
    began = time.monotonic()
    try:
        app.redis.ping()
    except redis.exceptions.ConnectionError as exc:
        raised.append(exc)
    finally:
        app.close()
    assert time.monotonic() - began < FAILS_WITHIN

    async def ping() -> None:
        await app.aredis().ping()

    began = time.monotonic()
    try:
        run_async(app, ping())
    except redis.exceptions.ConnectionError as exc:
        raised.append(exc)
    assert time.monotonic() - began < FAILS_WITHIN
    assert len(raised) == 2, "a PING succeeded"
    return raised[0], raised[1]


def test_a_wrong_ca_fails_at_once_saying_the_certificate_failed(tls_server: TLSRedisServer,
                                                                certs: Certificates) -> None:
    for exc in refusal(tls_server.bare_url + certs.query(ca=certs.other_ca, client=False)):
        assert "certificate verify failed" in str(exc)


def test_a_missing_client_certificate_fails_at_once(mtls_server: TLSRedisServer,
                                                    certs: Certificates) -> None:
    """The server refuses the handshake after it ends on the client's side (TLS 1.3), so
    redis-py sees the connection closed, not a certificate error."""
    url = mtls_server.bare_url + certs.query(client=False)
    for exc in refusal(url):
        assert str(exc)  # a ConnectionError with a message (the text is OpenSSL's)
        # What the worker, the CLI and the dashboard say points at the client certificate.
        assert "ssl_certfile" in describe(exc, url), describe(exc, url)


def test_a_worker_with_a_wrong_ca_says_why_and_stops_when_told(tls_server: TLSRedisServer,
                                                               certs: Certificates,
                                                               tmp_path: Path) -> None:
    """The worker keeps trying (Redis may yet be fixed) but logs the certificate failure at
    once, and a SIGTERM stops it."""
    url = tls_server.bare_url + certs.query(ca=certs.other_ca, client=False)
    log = tmp_path / "worker.log"
    env = env_with_src() | {"CONVEYOR_REDIS_URL": url,
                            "RUNNING_APP_NAMESPACE": f"tls{uuid.uuid4().hex[:8]}"}
    with log.open("wb") as out:
        proc = subprocess.Popen([CONVEYOR, "worker", "running_app:app"], env=env, cwd=TESTS,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "certificate verify failed" in log.read_text(errors="replace")
                   or proc.poll() is not None, 15, message="the worker to say why")
        text = log.read_text(errors="replace")
        assert "certificate verify failed" in text, text
        assert "cannot reach Redis" in text
    finally:
        stop_processes([proc], grace=10)
    assert proc.returncode is not None


# -- Cluster and Sentinel --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cluster(certs: Certificates) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tls=certs).start()
    yield cluster
    cluster.cleanup()


def test_jobs_run_on_a_cluster_over_mutual_tls(tls_cluster: RedisCluster) -> None:
    """The cluster clients pass the certificates to every node they discover."""
    app = make_app(tls_cluster.url)
    add, aadd = app.tasks["add"], app.tasks["aadd"]
    try:
        jobs = [add.options(queue=f"q{i}").enqueue(i, 1) for i in range(6)]

        async def produce() -> Any:
            return await aadd.aenqueue(3, 4)

        jobs.append(run_async(app, produce()))
        with running_worker(app, queues=[f"q{i}" for i in range(6)] + ["default"],
                            concurrency=4):
            assert [job.result(timeout=15) for job in jobs] == [*range(1, 7), 7]
        assert len({tls_cluster.node_of(app.keys(f"q{i}").wake) for i in range(6)}) > 1
    finally:
        app.close()


@pytest.fixture(scope="module")
def tls_sentinel(certs: Certificates) -> Iterator[TLSSentinel]:
    group = TLSSentinel(certs).start()
    yield group
    group.cleanup()


@pytest.mark.parametrize("how", ["url", "keyword"])
def test_jobs_run_through_a_sentinel_over_mutual_tls(tls_sentinel: TLSSentinel,
                                                     certs: Certificates, how: str) -> None:
    """The certificates go to the connections to the sentinel and to the primary it
    names, given in the URL or as ``ssl=``."""
    if how == "url":
        app = make_app(tls_sentinel.url)
    else:
        app = make_app(tls_sentinel.url.partition("?")[0], ssl={
            "ca_certs": certs.ca, "certfile": certs.client_cert, "keyfile": certs.client_key})
    add, aadd = app.tasks["add"], app.tasks["aadd"]
    try:
        job = add.enqueue(1, 2)

        async def produce() -> Any:
            return await aadd.aenqueue(3, 4)

        async_job = run_async(app, produce())
        with running_worker(app, concurrency=4):
            assert (job.result(timeout=10), async_job.result(timeout=10)) == (3, 7)
    finally:
        app.close()
