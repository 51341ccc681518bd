"""Typing test: every line here must type-check under mypy --strict and pyright.

Run by ``python tests/typecheck/check.py`` (``make lint``); not collected by pytest.
"""

from __future__ import annotations

from typing import Any, assert_type

import conveyor
from conveyor import testing

app = conveyor.Conveyor("redis://127.0.0.1:6379/0")


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="emails.send", queue="emails", retries=5)
async def send_email(user_id: int, template: str = "welcome") -> bool:
    return True


@app.periodic("*/5 * * * *")
def report() -> dict[str, int]:
    return {}


@app.task(retries=5, retry_on=(TimeoutError, ConnectionError))
def fetch_rates(day: str) -> float:
    raise conveyor.Fail("no rates for " + day)


@app.task(retries=5, no_retry_on=ValueError)
async def import_row(row: dict[str, str]) -> None:
    return None


@app.task(batch=conveyor.Batch(max=50, wait=1.0))
def bulk_insert(items: list[conveyor.BatchItem]) -> None:
    for item in items:
        item.result = item.args


@app.task(queue="search", batch=conveyor.Batch(max=100, by="tenant"))
async def index(items: list[conveyor.BatchItem]) -> None:
    items[0].fail("refused")


def sync_side() -> None:
    task: conveyor.Task[[int, int], int] = add
    same: conveyor.Task[[int, int], int] = add.options(priority=9)
    print(task, same)
    assert_type(add(1, 2), int)
    job = add.enqueue(1, 2)
    assert_type(job, conveyor.Job[int])
    assert_type(job.result(timeout=10), int)
    assert_type(add.enqueue(x=1, y=2).result(), int)
    assert_type(add.options(delay=30).enqueue(1, 2), conveyor.Job[int])
    assert_type(add.enqueue_many([(1, 2), (3, 4)]), list[conveyor.Job[int]])
    assert_type(send_email.enqueue(7), conveyor.Job[bool])
    assert_type(send_email.enqueue(7, template="reset").result(), bool)
    assert_type(report.enqueue().result(), dict[str, int])
    assert_type(fetch_rates.enqueue("2026-11-26").result(), float)
    assert_type(import_row.enqueue({"a": "b"}), conveyor.Job[None])
    assert_type(app.job("default~abc"), conveyor.Job[Any])
    assert_type(bulk_insert.enqueue({"row": 1}, table="events"), conveyor.Job[Any])
    assert_type(index.enqueue_many(["doc-1", "doc-2"]), list[conveyor.Job[Any]])
    with testing.inline(app):
        assert_type(add.enqueue(1, 2).result(), int)
    assert_type(testing.drain(app), list[conveyor.JobInfo])


async def async_side() -> None:
    job = await add.aenqueue(1, 2)
    assert_type(job, conveyor.Job[int])
    assert_type(await job.aresult(), int)
    assert_type(await send_email.aenqueue(1), conveyor.Job[bool])
    assert_type(await send_email(1), bool)
    assert_type(await add.aenqueue_many([(1, 2)]), list[conveyor.Job[int]])
