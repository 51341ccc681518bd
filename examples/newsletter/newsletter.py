"""A newsletter cut into batches for several tenants, as plain code.

Each tenant's newsletter is cut into batches of recipients; tenants take turns (fairness),
password resets jump the queue (priority 9), a transient relay error is retried with
backoff, and a relay that always refuses ends in the dead letters.

Run: ``python newsletter.py`` (it runs a worker in this process until every job ended and
prints a summary), or enqueue with ``python newsletter.py --enqueue-only`` and run
``conveyor worker newsletter:app`` yourself.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import conveyor

app = conveyor.Conveyor(namespace=os.environ.get("CONVEYOR_NAMESPACE", "newsletter-example"))
TENANTS = {"acme": 30, "globex": 10, "initech": 5}  # batches of 100 recipients each
REFUSING = {("globex", 7)}  # a relay that always says no: that batch ends dead


class RelayBusy(Exception):
    """421: try again later."""


@app.task(name="newsletter.send_batch", queue="newsletter", retries=3, backoff=0.1)
def send_batch(tenant: str, batch: int, recipients: int) -> int:
    time.sleep(0.001 * recipients / 100)
    if (tenant, batch) in REFUSING:
        raise RuntimeError(f"550 relay refused batch {batch} of {tenant}")
    if random.random() < 0.05:
        raise RelayBusy("421 try again later")
    return recipients


@app.task(name="newsletter.password_reset", queue="newsletter")
def password_reset(user_id: int) -> str:
    return f"reset link sent to user {user_id}"


def enqueue() -> list[conveyor.Job[int] | conveyor.Job[str]]:
    jobs: list[conveyor.Job[int] | conveyor.Job[str]] = []
    for tenant, batches in TENANTS.items():
        jobs += send_batch.options(tenant=tenant).enqueue_many(
            [(tenant, b, 100) for b in range(batches)])
    jobs += password_reset.options(priority=9).enqueue_many([(u,) for u in range(3)])
    return jobs


def main() -> int:
    jobs = enqueue()
    print(f"enqueued {len(jobs)} jobs")
    if "--enqueue-only" in sys.argv:
        return 0
    worker = app.worker(queues=["newsletter"], concurrency=8)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    infos = []
    for job in jobs:
        while not (info := job.info()).state.finished:
            time.sleep(0.05)
        infos.append(info)
    worker.stop()
    thread.join(30)
    states: dict[str, int] = {}
    for info in infos:
        states[info.state.value] = states.get(info.state.value, 0) + 1
    sent = sum(i.result for i in infos
               if i.task == send_batch.name and i.state == conveyor.JobState.SUCCEEDED)
    print(f"states: {dict(sorted(states.items()))}; recipients reached: {sent}")
    for dead in app.dead_letters("newsletter").list():
        print(f"dead: {dead.id} {(dead.error or '').splitlines()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
