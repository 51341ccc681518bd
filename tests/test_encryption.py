"""Encrypted tasks against a real redis-server: what is stored is sealed (the dump, the
AOF, the events stream and the SQL sink hold no clear text), what runs gets the clear
arguments, rotation loses nothing, and a worker without the key dead-letters the job with
a reason and loses nothing."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import conveyor
from conveyor.cli import main as cli
from conveyor.encryption import ENCRYPTED, is_sealed, unwrap
from conveyor.monitor.lists import read_job_detail
from conveyor.redaction import REDACTED
from conveyor.reseal import reseal
from conveyor.sink import DEFAULT_TABLE, Sink, stream_events
from conveyor.testing import inline
from helpers import RedisServer, env_with_src, record_field, running_worker, wait_until

K1, K2 = os.urandom(32), os.urandom(32)
SECRET = "4111-1111-1111-1111"  # what must never be stored in clear


def _app(url: str, namespace: str, keys: dict[str, bytes] | None, current: str = "k1",
         **options: Any) -> conveyor.Conveyor:
    encryption = None if keys is None else conveyor.Encryption(keys=keys, current=current)
    app = conveyor.Conveyor(url, namespace=namespace, encryption=encryption, **options)

    @app.task(name="charge", queue="pay", encrypt=True, retries=0)
    def charge(card: str, cents: int) -> dict[str, Any]:
        return {"card": card, "cents": cents}

    @app.task(name="plain", queue="pay", redact=("card",))
    def plain(user: str, card: str, note: str = "") -> str:
        return f"{user}:{len(card)}"

    return app


@pytest.fixture
def server() -> Iterator[RedisServer]:
    s = RedisServer(durable=True).start()
    yield s
    s.cleanup()


@pytest.fixture
def ns() -> str:
    return f"e{uuid.uuid4().hex[:8]}"


def test_arguments_and_result_are_sealed_at_rest_and_clear_to_the_task(
        server: RedisServer, ns: str, tmp_path: Path) -> None:
    app = _app(server.url, ns, {"k1": K1})
    stream_events(app, "pay")  # a sink reads this queue: finished jobs are streamed
    job = app.tasks["charge"].enqueue(SECRET, 1999)
    stored = record_field(app, job.id, "a")
    assert stored is not None and is_sealed(stored) and SECRET.encode() not in stored
    assert unwrap(stored).key_id == "k1" and unwrap(stored).bound == job.id
    with running_worker(app, queues=["pay"]):
        assert job.result(timeout=10) == {"card": SECRET, "cents": 1999}
    raw_result = record_field(app, job.id, "result")
    assert raw_result is not None and is_sealed(raw_result)
    # The SQL sink and the events stream: no clear text.
    db = tmp_path / "sink.db"
    sink = Sink(app, f"sqlite:///{db}", queues=["pay"])
    sink.run(until_idle=True)
    sink.close()
    assert _rows(db) == 1
    assert SECRET.encode() not in db.read_bytes()
    stream = app.redis.xrange(app.keys("pay").events)
    assert stream and SECRET.encode() not in repr(stream).encode()
    # The persistence files: an RDB snapshot and the AOF.
    app.redis.save()
    app.redis.bgrewriteaof()
    # Read the files once the rewrite is done (its temporary files come and go meanwhile).
    wait_until(lambda: app.redis.info("persistence")["aof_rewrite_in_progress"] == 0
               and app.redis.info("persistence")["aof_rewrite_scheduled"] == 0, 10,
               message="the AOF rewrite")
    files = [p for p in server.dir.rglob("*") if p.is_file() and p.suffix in (".rdb", ".aof")]
    assert files, "no persistence files written"
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
    app.close()


def _rows(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        try:
            return int(conn.execute(f"select count(*) from {DEFAULT_TABLE}").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def test_views_show_encrypted_and_redacted(server: RedisServer, ns: str) -> None:
    app = _app(server.url, ns, {"k1": K1})
    sealed = app.tasks["charge"].enqueue(SECRET, 5)
    hidden = app.tasks["plain"].enqueue("ann", SECRET, note="hello")
    with running_worker(app, queues=["pay"]):
        sealed.result(timeout=10)
        hidden.result(timeout=10)
    detail = read_job_detail(app, sealed.id)
    assert detail.args == ENCRYPTED and detail.info.result == ENCRYPTED
    detail = read_job_detail(app, hidden.id)
    assert detail.args == ["ann", REDACTED] and detail.kwargs == {"note": "hello"}
    # The CLI without the app: the worker published which parameters are redacted.
    out = CliRunner().invoke(cli, ["job", sealed.id, "--url", server.url, "--namespace", ns,
                                   "--json"])
    assert out.exit_code == 0, out.output
    shown = json.loads(out.output)
    assert shown["args"] == ENCRYPTED and shown["result"] == ENCRYPTED
    assert SECRET not in out.output
    out = CliRunner().invoke(cli, ["job", hidden.id, "--url", server.url, "--namespace", ns])
    assert out.exit_code == 0, out.output
    assert REDACTED in out.output and SECRET not in out.output and "ann" in out.output
    # The dashboard's job page and its JSON.
    from starlette.testclient import TestClient

    from conveyor.web import create_app
    with TestClient(create_app(app)) as client:
        for url in (f"/jobs/{sealed.id}", f"/jobs/{hidden.id}", f"/api/jobs/{sealed.id}",
                    f"/api/jobs/{hidden.id}"):
            page = client.get(url)
            assert page.status_code == 200, url
            assert SECRET not in page.text, url
        assert ENCRYPTED in client.get(f"/jobs/{sealed.id}").text
        assert REDACTED in client.get(f"/jobs/{hidden.id}").text
    app.close()


def test_a_worker_without_the_key_dead_letters_and_loses_nothing(server: RedisServer,
                                                                  ns: str) -> None:
    producer = _app(server.url, ns, {"k1": K1})
    job = producer.tasks["charge"].enqueue(SECRET, 7)
    keyless = _app(server.url, ns, None)
    with running_worker(keyless, queues=["pay"]):
        wait_until(lambda: job.info().state == conveyor.JobState.DEAD, 10)
    info = job.info()
    assert info.error is not None and "'k1'" in info.error and "no encryption keys" in info.error
    wrong = _app(server.url, ns, {"k2": K2}, current="k2")
    job2 = producer.tasks["charge"].enqueue(SECRET, 8)
    with running_worker(wrong, queues=["pay"]):
        wait_until(lambda: job2.info().state == conveyor.JobState.DEAD, 10)
    assert "'k1'" in (job2.info().error or "") and "does not have" in (job2.info().error or "")
    # Nothing lost: the key deployed, the dead jobs requeued, they run.
    assert producer.dead_letters("pay").requeue() == 2
    with running_worker(producer, queues=["pay"]):
        assert job.result(timeout=10)["cents"] == 7
        assert job2.result(timeout=10)["cents"] == 8
    for a in (producer, keyless, wrong):
        a.close()


def test_a_ciphertext_moved_to_another_job_does_not_open(server: RedisServer, ns: str) -> None:
    app = _app(server.url, ns, {"k1": K1})
    app.queue("pay").pause()
    first = app.tasks["charge"].enqueue(SECRET, 1)
    second = app.tasks["charge"].enqueue("0000", 2)
    stolen = record_field(app, first.id, "a")
    app.redis.hset(app.keys("pay").job(second.short_id), "a", stolen)
    app.queue("pay").resume()
    with running_worker(app, queues=["pay"]):
        assert first.result(timeout=10)["cents"] == 1
        wait_until(lambda: second.info().state == conveyor.JobState.DEAD, 10)
    assert "another job" in (second.info().error or "")
    app.close()


def test_rotation_while_jobs_flow_loses_none(server: RedisServer, ns: str) -> None:
    old = _app(server.url, ns, {"k1": K1})
    both = _app(server.url, ns, {"k1": K1, "k2": K2}, current="k2")
    new = _app(server.url, ns, {"k2": K2}, current="k2")
    before = [old.tasks["charge"].enqueue(f"{SECRET}-{i}", i) for i in range(40)]
    delayed = [old.tasks["charge"].options(delay=3600).enqueue(f"{SECRET}-d{i}", i)
               for i in range(5)]
    # Step 1: every process lists k2 and makes it current; jobs of both keys run.
    with running_worker(both, queues=["pay"], concurrency=4):
        during = [both.tasks["charge"].enqueue(f"{SECRET}-n{i}", i) for i in range(40)]
        # Step 2: reseal while the worker runs jobs.
        report = reseal(both, "pay")
        assert not report.unreadable and not report.busy
        for job in before + during:  # read by a process holding both keys
            assert both.job(job.id).result(timeout=20)["card"].startswith(SECRET)
    # A process without the key a result is sealed under sees it as [encrypted].
    assert old.job(during[0].id).result(timeout=1) == ENCRYPTED
    for job in delayed:
        raw = record_field(both, job.id, "a")
        assert raw is not None and unwrap(raw).key_id == "k2"
    # Step 3: k1 dropped; the delayed jobs, resealed, still run, and finished results open.
    for job in delayed:
        new.job(job.id).info()  # readable record
    both.redis.zadd(both.keys("pay").delayed, {j.short_id: 0 for j in delayed})
    with running_worker(new, queues=["pay"]):
        for i, job in enumerate(delayed):
            assert new.job(job.id).result(timeout=20) == {"card": f"{SECRET}-d{i}", "cents": i}
    assert new.job(before[0].id).result(timeout=1)["cents"] == 0  # resealed result opens
    for a in (old, both, new):
        a.close()


def test_reseal_cli_needs_the_keys_and_reports(server: RedisServer, ns: str,
                                               tmp_path: Path) -> None:
    old = _app(server.url, ns, {"k1": K1})
    old.tasks["charge"].options(delay=3600).enqueue(SECRET, 1)
    module = tmp_path / "rotating_app.py"
    module.write_text(
        "import os, conveyor\n"
        f"K1, K2 = bytes.fromhex({K1.hex()!r}), bytes.fromhex({K2.hex()!r})\n"
        f"app = conveyor.Conveyor({server.url!r}, namespace={ns!r},\n"
        "    encryption=conveyor.Encryption(keys={'k1': K1, 'k2': K2}, current='k2'))\n"
        "@app.task(name='charge', queue='pay', encrypt=True)\n"
        "def charge(card: str, cents: int) -> None: ...\n")
    env = env_with_src() | {"PYTHONPATH": f"{tmp_path}:{env_with_src()['PYTHONPATH']}"}
    done = subprocess.run([sys.executable, "-m", "conveyor", "reseal", "pay", "--app",
                           "rotating_app:app"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr + done.stdout
    assert "1 resealed under key 'k2'" in done.stdout
    again = subprocess.run([sys.executable, "-m", "conveyor", "reseal", "pay", "--app",
                            "rotating_app:app"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert "0 resealed" in again.stdout
    keyless = subprocess.run([sys.executable, "-m", "conveyor", "reseal", "pay", "--url",
                              server.url, "--namespace", ns], env=env, capture_output=True,
                             text=True, timeout=60)
    assert keyless.returncode != 0 and "encryption keys" in keyless.stderr
    old.close()


def test_dedupe_and_debounce_keys_are_stored_as_hmacs(server: RedisServer, ns: str) -> None:
    app = _app(server.url, ns, {"k1": K1})
    charge = app.tasks["charge"]
    first = charge.options(key=f"card:{SECRET}").enqueue(SECRET, 1)
    assert charge.options(key=f"card:{SECRET}").enqueue(SECRET, 1).id == first.id
    debounced = charge.options(key=f"deb:{SECRET}", debounce=0.3)
    d1 = debounced.enqueue(SECRET, 10)
    d2 = debounced.enqueue(SECRET, 11)  # replaces the arguments of the same job
    assert d1.id == d2.id
    names = b" ".join(app.redis.keys("*"))
    assert SECRET.encode() not in names
    for key in app.redis.keys("*"):
        if app.redis.type(key) == b"string":
            assert SECRET.encode() not in (app.redis.get(key) or b"")
    with running_worker(app, queues=["pay"]):
        assert d1.result(timeout=10)["cents"] == 11  # the latest arguments open and run
        assert first.result(timeout=10)["cents"] == 1
    app.close()


def test_steps_children_and_workflows_of_encrypted_tasks(server: RedisServer, ns: str) -> None:
    app = _app(server.url, ns, {"k1": K1})

    @app.task(name="card_of", queue="pay", encrypt=True)
    def card_of(user: str) -> str:
        return f"{SECRET}:{user}"

    @app.task(name="parent", queue="pay", encrypt=True)
    def parent(user: str) -> str:
        ctx = conveyor.current_job()
        assert ctx is not None
        stepped = ctx.step("lookup", lambda: f"{SECRET}-step")
        child = ctx.child("card", card_of, user)
        return f"{stepped}|{child}"

    @app.task(name="after", queue="pay", encrypt=True)
    def after() -> str:
        ctx = conveyor.current_job()
        assert ctx is not None
        return "got " + ",".join(sorted(ctx.parent_results().values()))

    job = parent.enqueue("ann")
    wf = app.workflow()
    conveyor.chain(wf, (card_of, "bob"), after)
    handle = wf.enqueue()
    with running_worker(app, queues=["pay"], concurrency=2):
        assert job.result(timeout=20) == f"{SECRET}-step|{SECRET}:ann"
        results = handle.result(timeout=20)
    assert sorted(results.values()) == [f"{SECRET}:bob", f"got {SECRET}:bob"]
    # The dashboard (which here holds the key) shows the nodes' results as [encrypted].
    from starlette.testclient import TestClient

    from conveyor.web import create_app
    with TestClient(create_app(app)) as client:
        for url in (f"/workflows/{handle.id}", f"/api/workflows/{handle.id}"):
            page = client.get(url)
            assert page.status_code == 200 and SECRET not in page.text, url
            assert ENCRYPTED in page.text, url
    record = app.redis.hgetall(app.keys("pay").job(job.short_id))
    assert is_sealed(record[b"step:lookup"])
    assert not any(SECRET.encode() in v for v in record.values())
    app.close()


def test_inline_testing_runs_encrypted_tasks(server: RedisServer, ns: str) -> None:
    app = _app(server.url, ns, {"k1": K1})
    with inline(app):
        job = app.tasks["charge"].enqueue(SECRET, 3)
        assert job.result(timeout=1) == {"card": SECRET, "cents": 3}
    app.close()


def test_configuration_errors_name_what_is_wrong(server: RedisServer, ns: str) -> None:
    with pytest.raises(conveyor.ConfigurationError, match="32 bytes"):
        conveyor.Encryption(keys={"k1": b"short"}, current="k1")
    with pytest.raises(conveyor.ConfigurationError, match="not one of the keys"):
        conveyor.Encryption(keys={"k1": K1}, current="k9")
    app = _app(server.url, ns, None)
    with pytest.raises(conveyor.ConfigurationError, match=r"encrypt=True.*no encryption keys"):
        app.tasks["charge"].enqueue(SECRET, 1)
    assert app.redis.keys(f"*{ns}*") == []  # nothing stored
    with pytest.raises(conveyor.ConfigurationError, match="not parameters"):
        @app.task(redact=("nope",))
        def f(a: int) -> None: ...
    assert "K1" not in repr(conveyor.Encryption(keys={"k1": K1}, current="k1"))
    app.close()


def test_reseal_reaches_a_suspended_parents_copy_of_its_childs_result(server: RedisServer,
                                                                       ns: str) -> None:
    def build(keys: dict[str, bytes], current: str) -> conveyor.Conveyor:
        app = _app(server.url, ns, keys, current)

        @app.task(name="kid", queue="kids", encrypt=True)
        def kid(user: str) -> str:
            return f"{SECRET}:{user}"

        @app.task(name="parent", queue="pay", encrypt=True)
        def parent(user: str) -> str:
            ctx = conveyor.current_job()
            assert ctx is not None
            return "got " + ctx.child("kid", kid, user)

        return app

    old, both, new = build({"k1": K1}, "k1"), build({"k1": K1, "k2": K2}, "k2"), \
        build({"k2": K2}, "k2")
    job = old.tasks["parent"].enqueue("ann")
    with running_worker(old, queues=["pay"]):  # runs until it suspends on its child
        wait_until(lambda: job.info().state == conveyor.JobState.SUSPENDED, 10)
    with running_worker(old, queues=["kids"]):  # the child ends: its result is copied
        wait_until(lambda: job.info().state == conveyor.JobState.READY, 10)
    held = record_field(old, job.id, "w:kid")
    assert held is not None and held[:1] == b"o" and unwrap(held[1:]).key_id == "k1"
    report = reseal(both, "pay")
    assert report.resealed == 1 and not report.unreadable
    held = record_field(old, job.id, "w:kid")
    assert held is not None and unwrap(held[1:]).key_id == "k2"
    with running_worker(new, queues=["pay"]):  # k1 is gone: the copy opens under k2
        assert new.job(job.id).result(timeout=10) == f"got {SECRET}:ann"
    for a in (old, both, new):
        a.close()


def test_a_worker_drops_the_redactions_its_tasks_no_longer_have(server: RedisServer,
                                                                ns: str) -> None:
    from conveyor import redaction
    from conveyor.keys import redactions_key
    from helpers import run_async

    async def publish(a: conveyor.Conveyor) -> None:
        await redaction.apublish(a, a.aredis())

    app = _app(server.url, ns, {"k1": K1})
    run_async(app, publish(app))
    assert app.redis.hget(redactions_key(ns), "plain") is not None
    later = conveyor.Conveyor(server.url, namespace=ns)

    @later.task(name="plain", queue="pay")  # the same task, redacting nothing now
    def plain(user: str, card: str, note: str = "") -> str:
        return user

    run_async(later, publish(later))
    assert app.redis.hget(redactions_key(ns), "plain") is None
    for a in (app, later):
        a.close()


def test_a_reseal_whose_reply_is_lost_reads_again_and_finishes(server: RedisServer,
                                                               ns: str) -> None:
    from lost_reply import LoseReplies

    old = _app(server.url, ns, {"k1": K1})
    job = old.tasks["charge"].options(delay=3600).enqueue(SECRET, 4)
    both = _app(server.url, ns, {"k1": K1, "k2": K2}, current="k2")
    with LoseReplies(b"EXEC") as lost:  # the rewrite is applied, its reply never comes
        report = reseal(both, "pay")
    assert lost.lost == 1  # the fault did happen
    assert not report.unreadable and not report.busy
    raw = record_field(both, job.id, "a")
    assert raw is not None and unwrap(raw).key_id == "k2"
    new = _app(server.url, ns, {"k2": K2}, current="k2")
    assert new.encryption is not None
    assert both.codec.decode_args(new.encryption.open(raw, "charge", "args", job.id))[0] == \
        [SECRET, 4]
    for a in (old, both, new):
        a.close()
