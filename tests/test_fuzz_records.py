"""Bad data, fuzzed: whatever hypothesis writes into a queue's records, lists and sorted
sets (wrong types, non-numeric and non-UTF-8 fields, missing fields, ids without a record,
a job record or a tenant's ready list replaced by a value of another type),
the scripts a worker runs never fail, every job still ends (succeeded, or dead with a
reason), the counters come back to what the records say, and reading the jobs back never
raises. The CLI and the dashboard then read a mangled queue without an error.

The scripts are driven as a worker drives them, with the scripts' ``now`` override so that
leases expire and delayed jobs come due without sleeping. ``CONVEYOR_FUZZ_EXAMPLES`` raises
the number of examples (default 60, for CI).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import conveyor
from conveyor.scripts import calls
from helpers import ModuleServer, RedisServer, env_with_src

EXAMPLES = int(os.environ.get("CONVEYOR_FUZZ_EXAMPLES", "60"))
VT = 1000
FIELDS = ("s", "p", "attempts", "m", "v", "t", "tenant",
          "e", "run_at", "a", "token", "key", "started_at")
JUNK = st.one_of(
    st.sampled_from([b"", b"-1", b"0", b"10", b"1e400", b"nan", b"inf", b"1.5", b"ready",
                     b"active", b"scheduled", b"dead", b"\xff\xfe", b"\x00", b"[[],{}]"]),
    st.binary(max_size=12),
)
SERVER = ModuleServer()
_server = SERVER.fixture()


def _retype(r: Any, key: str, kind: str) -> None:
    """Replace ``key`` by a value of type ``kind``."""
    r.delete(key)
    {"string": lambda: r.set(key, "by hand"), "list": lambda: r.rpush(key, "by hand"),
     "set": lambda: r.sadd(key, "by hand"), "hash": lambda: r.hset(key, "by", "hand")}[kind]()


def _mangle(app: conveyor.Conveyor, ids: list[str]) -> Any:
    """A strategy of one mangling step: (description, function of the Redis client)."""
    k = app.keys("q")
    job = st.sampled_from(ids)
    kind = st.sampled_from(["string", "list", "set", "hash"])
    return st.one_of(
        st.tuples(st.just("retype"), job, kind.filter(lambda x: x != "hash")).map(
            lambda t: (t, lambda r: _retype(r, k.job(t[1]), t[2]))),
        # Lists that hold no id when it is written over (the tenant's jobs are delayed).
        st.tuples(st.just("retype-list"), st.sampled_from([k.ready("7:acme"), k.inbox]),
                  kind.filter(lambda x: x != "list")).map(
            lambda t: (t, lambda r: _retype(r, t[1], t[2]))),
        st.tuples(st.just("hset"), job, st.sampled_from(FIELDS), JUNK).map(
            lambda t: (t, lambda r: r.hset(k.job(t[1]), t[2], t[3]))),
        st.tuples(st.just("hdel"), job, st.sampled_from(FIELDS)).map(
            lambda t: (t, lambda r: r.hdel(k.job(t[1]), t[2]))),
        st.tuples(st.just("del"), job).map(lambda t: (t, lambda r: r.delete(k.job(t[1])))),
        st.tuples(st.just("ghost-ready"), JUNK).map(
            lambda t: (t, lambda r: r.rpush(k.ready_prefix + "5:", t[1]))),
        st.tuples(st.just("ghost-delayed"), JUNK).map(
            lambda t: (t, lambda r: r.zadd(k.delayed, {t[1]: 0}))),
        st.tuples(st.just("ghost-lease"), JUNK).map(
            lambda t: (t, lambda r: r.zadd(k.leases, {t[1]: 0}))),
    )


def _drive(app: conveyor.Conveyor, now: float) -> float:
    """Fetch and succeed everything, as workers would, until nothing is left to run: a job
    whose record a worker cannot read (``Leased.problem``) is dead-lettered with the reason,
    as a worker does."""
    k = app.keys("q")
    for _ in range(12):
        fetched = app.scripts.run(calls.fetch(k, 20, app.limits, now=now))
        outcomes = [calls.Outcome(j.short_id, j.token, "ok", now / 1000, b"1")
                    if j.problem is None else
                    calls.Outcome(j.short_id, j.token, "dead", now / 1000, j.problem)
                    for j in fetched.jobs]
        if outcomes:
            app.scripts.run(calls.finish(k, outcomes, app.limits, now=now))
        now += 3 * VT  # leases of jobs not acknowledged expire; delayed jobs come due
    return now


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_records_never_break_the_scripts(data: st.DataObject) -> None:
    app = conveyor.Conveyor(SERVER.url, namespace=f"f{uuid.uuid4().hex[:10]}")
    try:
        k = app.keys("q")
        now = 1_800_000_000_000.0
        app.redis.sadd(f"{app.namespace}:queues", "q")
        specs = [calls.JobSpec("t", 5, "", None, None, 2, "", VT),
                 calls.JobSpec("t", 7, "acme", 500.0, None, 2, "", VT),
                 calls.JobSpec("t", 5, "", None, None, 1, "dk", VT)]
        ids = []
        for n, spec in enumerate(specs):
            batch = [(f"j{n}{i}", b"[[],{}]") for i in range(2 if not spec.key else 1)]
            app.scripts.run(calls.enqueue(k, spec, batch, app.limits, now=now))
            ids.extend(short for short, _ in batch)
        app.scripts.run(calls.fetch(k, 1, app.limits, now=now))  # one job active
        for _description, mangle in data.draw(st.lists(_mangle(app, ids), min_size=1,
                                                      max_size=4), label="mangles"):
            with contextlib.suppress(redis.ResponseError):  # a hand edit Redis refused
                mangle(app.redis)
        _drive(app, now)

        for short in ids:
            record = app.redis.hgetall(k.job(short))
            if not record:
                continue  # deleted by the fuzz: nothing to run, nothing to report
            info = conveyor.JobInfo.from_record(app, "q", short, record)
            assert info.state in ("succeeded", "dead", "cancelled"), (short, record)
            if info.state == "dead":
                assert info.error, (short, record)
        app.dead_letters("q").list()  # never raises on what it finds
        assert app.redis.zcard(k.leases) == 0
        assert int(app.redis.hget(k.counts, "ready") or 0) <= 0 or not any(
            app.redis.llen(key) for key in app.redis.scan_iter(match=k.ready_prefix + "*"))
        active = app.redis.hgetall(k.active)
        assert all(int(v) == 0 for v in active.values()), active
    finally:
        app.close()


def _mangled_queue(app: conveyor.Conveyor) -> list[conveyor.Job]:
    @app.task(name="fz.ok", queue="fz")
    def ok(x: int) -> int:
        return x

    jobs = [*ok.enqueue_many([(i,) for i in range(6)]), ok.options(delay=60).enqueue(9)]
    k = app.keys("fz")
    app.redis.hset(k.job(jobs[0].short_id), "s", b"\xff")
    app.redis.hset(k.job(jobs[1].short_id), "e", "yesterday")
    app.redis.hset(k.job(jobs[2].short_id), "t", b"\xfe\xff")
    app.redis.hdel(k.job(jobs[3].short_id), "s", "p", "e")
    app.redis.hset(k.job(jobs[4].short_id), "tenant", b"\x80")
    app.redis.zadd(k.dead, {b"\xffghost": 1})
    app.redis.zadd(k.delayed, {b"nobody": 2})
    app.redis.zadd(k.leases, {b"\x00": 3})
    app.redis.hset(k.active, b"\xfe", "x")
    return jobs


def test_cli_and_dashboard_read_a_mangled_queue(app: conveyor.Conveyor,
                                                redis_server: RedisServer) -> None:
    from starlette.testclient import TestClient

    from conveyor.web import create_app

    jobs = _mangled_queue(app)
    with TestClient(create_app(app)) as client:
        for path in ("/", "/queues/fz", "/tasks", "/jobs", "/queues/fz/jobs?state=dead",
                     "/queues/fz/jobs?state=scheduled", "/queues/fz/jobs?state=active",
                     "/api/overview", "/api/queues/fz", "/api/tasks",
                     *(f"/jobs/{job.id}" for job in jobs), *(f"/api/jobs/{j.id}" for j in jobs)):
            assert client.get(path).status_code == 200, path
    env = env_with_src()
    env["CONVEYOR_REDIS_URL"] = redis_server.url
    conveyor_cli = str(Path(sys.executable).with_name("conveyor"))
    for args in (["info"], ["stats"], ["dead", "list", "fz"], *(["job", j.id] for j in jobs)):
        done = subprocess.run([conveyor_cli, *args, "--namespace", app.namespace], env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (args, done.stderr[-2000:])


def test_a_leased_record_that_lost_its_task_gives_its_active_count_back(
    app: conveyor.Conveyor,
) -> None:
    """A hypothesis find: the record of a leased job replaced by one without a task; its
    lease expired; the task's active count stayed at 1 for ever."""
    k = app.keys("q")
    now = 1_800_000_000_000.0
    spec = calls.JobSpec("t", 5, "", None, None, 2, "", VT)
    app.scripts.run(calls.enqueue(k, spec, [("j0", b"[[],{}]")], app.limits, now=now))
    assert [j.short_id for j in app.scripts.run(calls.fetch(k, 1, app.limits, now=now)).jobs
            ] == ["j0"]
    app.redis.delete(k.job("j0"))
    app.redis.hset(k.job("j0"), "s", b"")
    app.scripts.run(calls.fetch(k, 1, app.limits, now=now + 3 * VT))
    assert app.redis.hget(k.active, "t") == b"0"
    assert app.redis.hget(k.job("j0"), "s") == b"dead"
