"""Field names of a job record (the hash under ``QueueKeys.job``), and the defaults left
out of it.

A queued job costs Redis memory for every byte of its record, so the fields every job has
are one letter long and the options most jobs share are stored only when they differ from
the defaults below. ``scripts/include/job_record.lua`` holds the same names and defaults
(a test compares the two). Fields that only some jobs have (``tenant``, ``run_at``,
``attempts``, ``error``, ...) keep their readable names.
"""

from __future__ import annotations

TASK = "t"
STATE = "s"
ARGS = "a"
ENQUEUED_MS = "e"  # when it was enqueued, epoch milliseconds (server clock)
PRIORITY = "p"  # absent: DEFAULT_PRIORITY
MAX_ATTEMPTS = "m"  # absent: DEFAULT_MAX_ATTEMPTS
VISIBILITY_MS = "v"  # absent: DEFAULT_VISIBILITY_MS
# The id of the worker that leased the job (set by every lease, never cleared): it holds
# the job only while the state is active.
HOLDER = "w"

DEFAULT_PRIORITY = 5
DEFAULT_MAX_ATTEMPTS = 4
DEFAULT_VISIBILITY_MS = 30_000
