"""A small application for the CLI tests (queues 'cli' and 'cron')."""

import os
import time

import conveyor

app = conveyor.Conveyor(os.environ.get("CONVEYOR_REDIS_URL"),
                        namespace=os.environ.get("CLI_TEST_NAMESPACE", "cli-test"))


@app.task(name="cli.double", queue="cli", retries=0)
def double(x: int) -> int:
    if x < 0:
        raise ValueError(f"negative input {x}")
    return 2 * x


@app.periodic("*/5 * * * *", queue="cron", name="cli.rollup")
def rollup() -> None: ...


@app.task(name="cli.always_fails", queue="cli", retries=1, backoff=0.01)
def always_fails(x: int) -> None:
    raise RuntimeError(f"failed on {x}\nsecond line of the message")


@app.task(name="cli.sleep", queue="cli")
def sleep(seconds: float) -> None:
    time.sleep(seconds)
