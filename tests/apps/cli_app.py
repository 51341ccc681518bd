"""A small application for the CLI tests (queues 'cli' and 'cron')."""

import os

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
