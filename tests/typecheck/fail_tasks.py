"""Typing test: every line marked ``# error`` must be reported by mypy --strict and by
pyright, and no other line may be.

Run by ``python tests/typecheck/check.py`` (``make lint``); not collected by pytest.
"""

from __future__ import annotations

import conveyor

app = conveyor.Conveyor("redis://127.0.0.1:6379/0")


@app.task
def add(x: int, y: int) -> int:
    return x + y


@app.task(queue="emails")
async def send_email(user_id: int, template: str) -> bool:
    return True


@app.task(retry_on=("TimeoutError",))  # error
def misconfigured() -> None:
    return None


def wrong() -> None:
    add.enqueue("1", 2)  # error
    add.enqueue(1)  # error
    add.enqueue(1, 2, 3)  # error
    add.enqueue(1, z=2)  # error
    add.options(delay=5).enqueue(1, "2")  # error
    text: str = add.enqueue(1, 2).result()  # error
    send_email.enqueue("7", "welcome")  # error
    flag: str = send_email.enqueue(7, "welcome").result()  # error
    print(text, flag)


async def awrong() -> None:
    await add.aenqueue(1.5, 2)  # error
    name: str = await (await send_email.aenqueue(1, "x")).aresult()  # error
    print(name)
