"""The shop's tasks: plain django.tasks tasks, run by conveyor."""

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # the django-tasks package on older Djangos

from .models import Order


@task(priority=50, queue_name="emails")
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    order.receipt_sent = True
    order.save(update_fields=["receipt_sent"])
    return f"receipt sent to {order.customer}"


@task()
def add(x: int, y: int) -> int:
    return x + y


@task()
async def double(x: int) -> int:
    return 2 * x


@task(takes_context=True)
def flaky(context, succeed_on: int) -> int:  # type: ignore[no-untyped-def]
    if context.attempt < succeed_on:
        raise RuntimeError(f"attempt {context.attempt} failed on purpose")
    return context.attempt


@task()
def broken() -> None:
    raise ValueError("this task always fails")
