"""``python manage.py conveyor_worker [-q QUEUE ...] [-c N] [--backend ALIAS] [--burst]``:
run the jobs of a conveyor Tasks backend in this process."""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ... import ConveyorBackend, tasks_api


class Command(BaseCommand):  # type: ignore[misc]
    help = "Run a conveyor worker for the Django Tasks of this project."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("-q", "--queue", action="append", dest="queues",
                            help="queue to serve (repeatable; default: the backend's QUEUES)")
        parser.add_argument("-c", "--concurrency", type=int, default=8,
                            help="jobs running at once (threads; default 8)")
        parser.add_argument("--backend", default="default",
                            help="alias of the TASKS backend (default: 'default')")
        parser.add_argument("--burst", action="store_true",
                            help="exit once no job is ready")

    def handle(self, *args: Any, **options: Any) -> None:
        backend = tasks_api.task_backends[options["backend"]]
        if not isinstance(backend, ConveyorBackend):
            raise CommandError(f"TASKS[{options['backend']!r}] is not a ConveyorBackend")
        queues = options["queues"] or sorted(backend.queues) or ["default"]
        if not logging.getLogger().handlers:
            logging.basicConfig(level=logging.INFO,
                                format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.stdout.write(f"conveyor worker for {backend.app.url} serving {', '.join(queues)}")
        worker = backend.app.worker(queues=queues, concurrency=options["concurrency"])
        worker.run(burst=options["burst"])
