"""Django Tasks through conveyor, with the real example project (examples/django, SQLite):
enqueue from Django, run by `manage.py conveyor_worker`, read back with get_result."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import conveyor
from helpers import RedisServer, env_with_src, wait_until

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "django"
# Django 6 (django.tasks itself) needs Python >= 3.12; the main suite runs the backport.


def _python_312() -> str | None:
    for candidate in ("/root/.pyenv/versions/3.13.0/bin/python3",
                      "/root/.pyenv/versions/3.12.1/bin/python3",
                      shutil.which("python3.13"), shutil.which("python3.12")):
        if candidate and Path(candidate).exists() and subprocess.run(
                [candidate, "-c", "import venv"], capture_output=True, check=False
        ).returncode == 0:
            return candidate
    return None


PYTHON_312 = _python_312()


class Project:
    """The example project, on its own SQLite file and conveyor namespace."""

    def __init__(self, tmp: Path, server: RedisServer, namespace: str,
                 python: str = sys.executable) -> None:
        self.python = python
        self.env = env_with_src()
        self.env.update(SHOP_DB=str(tmp / "shop.sqlite3"), CONVEYOR_REDIS_URL=server.url,
                        CONVEYOR_NAMESPACE=namespace, DJANGO_SETTINGS_MODULE="mysite.settings")
        self.env["PYTHONPATH"] = os.pathsep.join([str(PROJECT), self.env.get("PYTHONPATH", "")])
        self.app = conveyor.Conveyor(server.url, namespace=namespace)
        self.tmp = tmp

    def manage(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run([self.python, "manage.py", *args], cwd=PROJECT, env=self.env,
                              capture_output=True, text=True, timeout=timeout, check=False)
        assert proc.returncode == 0, f"manage.py {args[0]} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    def shell(self, code: str) -> object:
        """Run ``code`` in the project (django.setup() done); it prints one JSON value."""
        return json.loads(self.manage("shell", "-c", code).strip().splitlines()[-1])

    def worker(self, *args: str) -> subprocess.Popen[bytes]:
        with (self.tmp / "worker.log").open("ab") as log:  # the process writes its own copy
            return subprocess.Popen([self.python, "manage.py", "conveyor_worker", *args],
                                    cwd=PROJECT, env=self.env, stdout=log, stderr=log)


@pytest.fixture
def project(tmp_path: Path, redis_server: RedisServer, namespace: str) -> Iterator[Project]:
    made = Project(tmp_path, redis_server, namespace)
    made.manage("migrate", "-v", "0")
    yield made
    made.app.close()


ENQUEUE = """
import json
from django.db import transaction
from shop.models import Order
from shop.tasks import add, broken, double, flaky, send_receipt
out = {}
order = Order.objects.create(customer="ada")
r = send_receipt.enqueue(order.pk)
out["receipt"] = [r.id, r.status]
out["add"] = add.using(priority=-100).enqueue(2, 3).id
out["double"] = double.enqueue(21).id
out["flaky"] = flaky.enqueue(succeed_on=2).id
out["broken"] = broken.enqueue().id
try:
    with transaction.atomic():
        Order.objects.create(customer="ghost")
        out["rolled_back"] = add.enqueue(0, 0).id
        raise RuntimeError("roll back")
except RuntimeError:
    pass
with transaction.atomic():
    out["committed"] = add.using(queue_name="emails").enqueue(1, 1).id
print(json.dumps(out))
"""

RESULTS = """
import json
from shop.models import Order
from shop.tasks import add, broken, double, flaky, send_receipt
ids = json.loads({ids!r})
def show(task, result_id):
    r = task.get_result(result_id)
    value = r.return_value if r.status == "SUCCESSFUL" else None
    return {{"status": str(r.status), "value": value, "attempts": r.attempts,
             "errors": [e.exception_class_path for e in r.errors],
             "finished": r.finished_at is not None}}
out = {{"receipt": show(send_receipt, ids["receipt"][0]), "add": show(add, ids["add"]),
       "double": show(double, ids["double"]), "flaky": show(flaky, ids["flaky"]),
       "broken": show(broken, ids["broken"]), "committed": show(add, ids["committed"]),
       "sent": list(Order.objects.filter(receipt_sent=True).values_list("customer", flat=True))}}
try:
    add.get_result(ids["rolled_back"])
    out["rolled_back"] = "exists"
except Exception as exc:
    out["rolled_back"] = type(exc).__name__
print(json.dumps(out))
"""


def test_django_tasks_run_through_conveyor(project: Project) -> None:
    run_the_shop(project)


@pytest.mark.slow
@pytest.mark.skipif(PYTHON_312 is None, reason="Django 6 needs Python >= 3.12")
def test_django_6_tasks_run_through_conveyor(tmp_path: Path, redis_server: RedisServer,
                                             namespace: str) -> None:
    assert PYTHON_312 is not None
    venv = tmp_path / "venv"
    subprocess.run([PYTHON_312, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    install = subprocess.run([python, "-m", "pip", "install", "-q", "django>=6", "-e", str(ROOT)],
                             capture_output=True, text=True, timeout=600, check=False)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    project = Project(tmp_path, redis_server, namespace, python=python)
    version = subprocess.run([python, "-c", "import django, django.tasks; print(django.VERSION)"],
                             capture_output=True, text=True, check=True).stdout
    assert version.startswith("(6,"), version
    project.manage("migrate", "-v", "0")
    try:
        run_the_shop(project)
    finally:
        project.app.close()


def run_the_shop(project: Project) -> None:
    ids = project.shell(ENQUEUE)
    assert isinstance(ids, dict)
    receipt_id, status = ids["receipt"]
    assert status == "READY"
    # The result id is the conveyor job id: priorities and queues were mapped.
    receipt = project.app.job(receipt_id).info()
    assert (receipt.queue, receipt.priority, receipt.task) == (
        "emails", 7, "shop.tasks.send_receipt")
    assert project.app.job(ids["add"]).info().priority == 0
    assert project.app.job(ids["committed"]).info().queue == "emails"
    with pytest.raises(conveyor.JobNotFound):  # enqueued in a transaction rolled back
        project.app.job(ids["rolled_back"]).info()

    worker = project.worker("-q", "default", "-q", "emails", "-c", "2")
    try:
        for name in ("receipt", "add", "double", "flaky", "broken", "committed"):
            job_id = ids[name][0] if name == "receipt" else ids[name]
            job = project.app.job(job_id)
            wait_until(lambda job=job: job.info().state.finished, 60, message=f"{name} done")
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, (project.tmp / "worker.log").read_text()

    out = project.shell(RESULTS.format(ids=json.dumps(ids)))
    assert isinstance(out, dict)
    assert out["receipt"] == {"status": "SUCCESSFUL", "value": "receipt sent to ada",
                              "attempts": 1, "errors": [], "finished": True}
    assert out["sent"] == ["ada"]  # the task wrote to the project's database
    assert out["add"]["value"] == 5 and out["double"]["value"] == 42
    assert out["committed"]["value"] == 2
    assert out["flaky"] == {"status": "SUCCESSFUL", "value": 2, "attempts": 2, "errors": [],
                            "finished": True}
    assert out["broken"]["status"] == "FAILED"
    assert out["broken"]["errors"] == ["builtins.ValueError"]
    assert out["broken"]["attempts"] == 2  # retries=1 in the project's OPTIONS
    assert out["rolled_back"] == "TaskResultDoesNotExist"


def test_run_after_defers_and_burst_worker(project: Project) -> None:
    code = """
import json
from datetime import timedelta
from django.utils import timezone
from shop.tasks import add
later = add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 2)
now = add.enqueue(3, 4)
print(json.dumps([later.id, now.id]))
"""
    later, now = project.shell(code)  # type: ignore[misc]
    info = project.app.job(later).info()
    assert info.state == conveyor.JobState.SCHEDULED
    assert info.run_at is not None and info.enqueued_at is not None
    assert 3500 < info.run_at - info.enqueued_at < 3700
    project.manage("conveyor_worker", "--burst", "-q", "default")
    assert project.app.job(now).result(timeout=5) == 7
    assert project.app.job(later).info().state == conveyor.JobState.SCHEDULED


TRACED = """
import json
from django.db import transaction
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from conveyor.contrib.otel import instrument
from shop.tasks import add
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
instrument(add.get_backend().app, tracer_provider=provider)
now = add.enqueue(2, 3).id
with transaction.atomic():
    committed = add.enqueue(1, 1).id
    inside = len(exporter.get_finished_spans())
try:
    with transaction.atomic():
        add.enqueue(0, 0)
        raise RuntimeError("roll back")
except RuntimeError:
    pass
spans = [{"name": s.name, "kind": s.kind.name, "trace": format(s.context.trace_id, "032x"),
          "queue": s.attributes["messaging.destination.name"]}
         for s in exporter.get_finished_spans()]
print(json.dumps({"ids": [now, committed], "inside": inside, "spans": spans}))
"""


def test_a_django_enqueue_is_traced(project: Project) -> None:
    """The Django backend's enqueues go through the enqueue hooks: an "enqueue <task>"
    span each, made when the job is stored (at commit for enqueue_on_commit; none for a
    rolled-back one), whose trace id the job's record keeps."""
    out = project.shell(TRACED)
    assert isinstance(out, dict)
    assert out["inside"] == 1  # the committed one is not stored (nor traced) before commit
    spans = out["spans"]
    assert [(s["name"], s["kind"], s["queue"]) for s in spans] == [
        ("enqueue shop.tasks.add", "PRODUCER", "default")] * 2
    traces = [s["trace"] for s in spans]
    stored = [project.app.redis.hget(project.app.keys("default").job(
        project.app.job(job_id).short_id), "tr") for job_id in out["ids"]]
    assert stored == [t.encode() for t in traces]


def test_priority_mapping_keeps_order() -> None:
    pytest.importorskip("django")
    from conveyor.contrib.django import to_conveyor_priority

    mapped = [to_conveyor_priority(p) for p in range(-100, 101)]
    assert mapped == sorted(mapped)
    assert (mapped[0], to_conveyor_priority(0), mapped[-1]) == (0, 5, 9)
    assert set(mapped) == set(range(10))
