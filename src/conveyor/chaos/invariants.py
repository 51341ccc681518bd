"""The promises of a chaos run, checked against what the tasks wrote in their ledger and
what conveyor recorded. Pure functions over plain data, so a test can hand them a ledger
with a lost job or a double success and see them fail.

The promises (DESIGN §5):

* every job whose enqueue returned ends ``succeeded``, ``dead`` (with a reason) or
  ``cancelled``, and no job record is left unfinished;
* only poison jobs end dead, and every poison job does;
* at most one success is recorded per job, and each success had a run that completed;
* a job is stored once however often its enqueue was sent: each label runs under one job
  id (an enqueue whose reply was lost, sent again, must not store a second copy);
* every run had a lease of its own, no job ran twice at once in one process, and the
  leases lost stay within what the faults could cost;
* an attempt is charged only for a run that started: the attempts a record counts, plus
  those it gave back for runs that started (``interruptions``: handed back by a stopping
  worker; ``snoozes``), equal the runs the ledger shows. A job leased and never run (a
  fetch whose reply was lost, a hand-off to a dead worker) must have its attempt given
  back, which leaves no trace: its lease and its refund cancel out;
* the counters (ready, active per task, dead letters, the limits' running counts) equal
  what the records say;
* a workflow's job never starts before each of its parents completed a run;
* durable waits: every wait job resumes with its own signal and its own child's result,
  no signal is consumed twice or left unconsumed, and no child is stored twice for one
  wait. A run that suspends is no re-execution: its attempt is given back (``suspends``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from .faults import Fault
from .tasks import WORK_KINDS, LedgerEntry

__all__ = ["Check", "Counters", "Evidence", "JobRecord", "Summary", "check"]

FINAL = ("succeeded", "dead", "cancelled", "expired")
STARTS = ("start", "late")  # a run began (late: past its job's expiry)
SHOWN = 8  # offending jobs named in a failed check's detail


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What conveyor recorded for one job the run enqueued.

    :param label: the run's name for the job (its task argument, also in the ledger)
    :param kind: ``work`` or a poison kind
    :param id: conveyor's job id
    :param state: the record's state (None: the record is missing)
    :param attempts: runs leased, as the record counts them
    :param error: the record's last error
    :param successes: ``succeeded`` events the queue's stream holds for the job
    :param refunds: attempts given back for runs that started, as the record counts them
        (``interruptions`` + ``snoozes``); an attempt given back for a job that never
        started is not counted anywhere, and needs not be: it undid its lease
    """

    label: str
    kind: str
    id: str
    state: str | None
    attempts: int
    error: str | None
    successes: int
    refunds: int = 0
    suspends: int = 0  # of the refunds: runs that suspended at a durable wait
    signal_left: bool = False  # a signal kept in the mailbox, never consumed
    signal_taken: bool = False  # the wait for the signal has its outcome recorded
    lost: int = 0  # leases the record says were lost (their holder died or stalled)
    # of those, leases given back as their run was not known to begin (include/maintain.lua)
    unstarted: int = 0


@dataclass(frozen=True, slots=True)
class Counters:
    """The queue's counters beside what its records and lists say."""

    ready_counter: int  # counts.ready
    ready_listed: int  # ids in the ready lists
    active: dict[str, int]  # active hash: task -> jobs leased
    leased: dict[str, int]  # leases whose record names the task, per task
    dead_letters: int  # members of the dead-letter set
    dead_records: int  # records in state dead
    running: int = 0  # counts.running: the queue's running count for its limits
    running_tenants: dict[str, int] = field(default_factory=dict)  # running hash
    leased_tenants: dict[str, int] = field(default_factory=dict)  # leases per tenant
    handed: int = 0  # counts.handed: jobs an enqueue handed straight to an idle worker


@dataclass(slots=True)
class Evidence:
    """Everything the checks look at, gathered once the run has settled."""

    jobs: list[JobRecord]
    ledger: list[LedgerEntry]
    counters: dict[str, Counters]  # queue -> its counters
    faults: list[Fault]
    cancelled: set[str] = field(default_factory=set)  # labels whose cancel() returned True
    cancel_unknown: set[str] = field(default_factory=set)  # labels whose cancel() raised
    stray: list[str] = field(default_factory=list)  # other unfinished records: "id state"
    edges: list[tuple[str, str]] = field(default_factory=list)  # workflow (parent, child)
    children: dict[str, int] = field(default_factory=dict)  # parent job id -> child records


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    held: bool
    detail: str
    offending: tuple[str, ...] = ()  # every offending job of a failed check (detail: a few)


@dataclass(frozen=True, slots=True)
class Summary:
    jobs: int
    poison: int
    runs: int
    reexecutions: int  # runs of work jobs beyond one each
    # leases of work jobs beyond one each: attempts, those given back for runs that
    # started (a run a stopping worker handed back) and those lost before their run was
    # told to begin, beyond one (each one a lost lease or a run handed back: a work task
    # never fails)
    lost_leases: int
    bound: int  # leases the faults could cost: the sum of their reaches
    lost_jobs: int  # jobs not in a final state
    states: dict[str, int]
    charged_without_run: int = 0  # attempts + refunds beyond the runs started, all jobs


def _names(items: Iterable[str]) -> str:
    items = list(items)
    more = f" (+{len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


def _verdict(name: str, bad: list[str], ok: str) -> Check:
    return Check(name, not bad, ok if not bad else f"{len(bad)}: {_names(bad)}", tuple(bad))


def _runs(ev: Evidence) -> Counter[str]:
    """Runs started per label, of the job the producer knows by that label: a start
    written under another job id is a run of a second copy (see :func:`_stored_once`)."""
    ids = {j.label: j.id for j in ev.jobs}
    return Counter(e.label for e in ev.ledger if e.phase in STARTS
                   and (not e.job or e.job == ids.get(e.label, e.job)))


def _charged(j: JobRecord, runs: Counter[str]) -> int:
    """Attempts charged to ``j`` without a run: those its record counts, plus those it
    gave back for runs that started, beyond the runs the ledger shows.

    One exception, by design (docs/guarantees.md, item 3): once a lease of the job was lost
    before its run was told (``unstarted``), its later leases tell their start *before*
    the run begins, so that a job that kills its worker as it starts is charged; a worker
    killed between that tell and the run's first line charges a lease that ran nothing.
    Such a lease was lost and charged, so at most ``lost - unstarted`` of them."""
    excess = max(0, j.attempts + j.refunds - runs[j.label])
    if j.unstarted:
        return max(0, excess - (j.lost - j.unstarted))
    return excess


def _overlaps(ledger: list[LedgerEntry]) -> list[str]:
    """Work jobs whose second run began in a process still running the first."""
    open_runs: Counter[tuple[str, int]] = Counter()
    bad = []
    for e in ledger:
        if e.kind not in WORK_KINDS:
            continue  # a hung poison run's thread outlives its attempt by design
        key = (e.label, e.pid)
        if e.phase in STARTS:
            if open_runs[key]:
                bad.append(f"{e.label} in pid {e.pid}")
            open_runs[key] += 1
        elif open_runs[key]:
            open_runs[key] -= 1
    return bad


def _describe(j: JobRecord) -> str:
    return f"{j.label} ({j.id}) {j.state or 'missing'} after {j.attempts} attempt(s)"


def _descendants(edges: Iterable[tuple[str, str]], roots: set[str]) -> set[str]:
    """The workflow jobs below ``roots``: a cancelled job cancels them (the run's workflow
    jobs run only after their parents succeeded)."""
    children: dict[str, list[str]] = {}
    for parent, child in edges:
        children.setdefault(parent, []).append(child)
    found: set[str] = set()
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _outcomes(ev: Evidence) -> list[Check]:
    unfinished = [_describe(j) for j in ev.jobs if j.state not in FINAL]
    dead_work = [f"{_describe(j)}: {j.error}" for j in ev.jobs
                 if j.state == "dead" and j.kind in WORK_KINDS]
    no_reason = [_describe(j) for j in ev.jobs if j.state == "dead" and not j.error]
    alive_poison = [_describe(j) for j in ev.jobs
                    if j.kind not in WORK_KINDS and j.state in FINAL and j.state != "dead"]
    cancelled = ev.cancelled | _descendants(ev.edges, ev.cancelled)
    unknown = ev.cancel_unknown | _descendants(ev.edges, ev.cancel_unknown)
    wrong_cancel = [_describe(j) for j in ev.jobs
                    if j.label not in unknown
                    and (j.label in cancelled) != (j.state == "cancelled")]
    return [
        _verdict("every job ends succeeded, dead or cancelled", unfinished,
                 f"all {len(ev.jobs)} jobs final"),
        _verdict("no job record left unfinished", list(ev.stray), "none"),
        _verdict("only poison jobs end dead", dead_work, "none of the work jobs died"),
        _verdict("every dead job has a reason", no_reason, "all have one"),
        _verdict("every poison job ends dead", alive_poison,
                 f"{sum(j.kind not in WORK_KINDS for j in ev.jobs)} poison jobs dead"),
        _verdict("cancelled exactly the jobs whose cancel returned True", wrong_cancel,
                 f"{len(ev.cancelled)} cancelled"),
    ]


def _successes(ev: Evidence, runs: Counter[str]) -> list[Check]:
    completed = {e.label for e in ev.ledger if e.phase == "ok"}
    doubles = [f"{_describe(j)}: {j.successes} successes" for j in ev.jobs if j.successes > 1]
    unfounded = [_describe(j) for j in ev.jobs
                 if j.state == "succeeded" and j.label not in completed]
    # Leases granted: the attempts charged, those given back for runs that started, and
    # those given back as their run was not known to begin (a run may have begun under
    # one all the same: its worker died before it told Redis).
    extra_runs = [f"{_describe(j)}, {j.refunds} refunded, {j.unstarted} given back"
                  f" unstarted: {runs[j.label]} runs"
                  for j in ev.jobs if runs[j.label] > j.attempts + j.refunds + j.unstarted]
    # DESIGN 5: an attempt is charged only for a run that started. A lease lost before its
    # worker told Redis that the run began gives its attempt back ('lu' on the record).
    charged = [f"{_describe(j)}, {j.refunds} refunded, {j.lost} lease(s) lost"
               f" ({j.unstarted} before their run was told): {runs[j.label]} run(s)"
               + (f" (last error: {j.error.splitlines()[0][:80]})" if j.error else "")
               for j in ev.jobs if _charged(j, runs) > 0]
    return [
        _verdict("at most one success recorded per job", doubles, "none twice"),
        _verdict("every success had a run that completed", unfounded, "all did"),
        _stored_once(ev),
        _verdict("every run had a lease of its own (runs <= leases granted)", extra_runs,
                 "all did"),
        _verdict("no attempt charged without a run (attempts + refunded <= runs)", charged,
                 "none"),
        _verdict("no job ran twice at once in one process", _overlaps(ev.ledger), "none"),
    ]


def _stored_once(ev: Evidence) -> Check:
    """Each label's runs name one job: the one its enqueue returned. A run under another id
    is a second copy of the job, stored by an enqueue sent again after a reply was lost (or
    by an enqueue that raised, then was sent again, having stored its jobs after all)."""
    ids = {j.label: j.id for j in ev.jobs}
    found: dict[str, set[str]] = {}
    for e in ev.ledger:
        if e.phase in STARTS and e.job:
            found.setdefault(e.label, set()).add(e.job)
    twice = []
    for label, jobs in found.items():
        copies = jobs | ({ids[label]} if label in ids else set())
        if len(copies) > 1:
            returned = f" (its enqueue returned {ids[label]})" if label in ids else ""
            twice.append(f"{label} ran as {', '.join(sorted(jobs))}{returned}")
    return _verdict("every job stored once (each label runs as one job)", twice,
                    f"{len(found)} labels ran, each as one job")


def _bound(summary: Summary) -> Check:
    held = summary.reexecutions <= summary.lost_leases <= summary.bound
    return Check("re-executions <= lost leases <= faults' reach", held,
                 f"{summary.reexecutions} <= {summary.lost_leases} <= {summary.bound}")


def _counters(c: Counters, queue: str = "") -> list[Check]:
    """The counter checks of one queue; ``queue`` names it after the first."""
    tasks = sorted(set(c.active) | set(c.leased))
    active = [f"{t}: active {c.active.get(t, 0)}, leases {c.leased.get(t, 0)}" for t in tasks
              if c.active.get(t, 0) != c.leased.get(t, 0) or c.active.get(t, 0) < 0]
    ready = [] if c.ready_counter == c.ready_listed else [
        f"counts.ready {c.ready_counter}, listed {c.ready_listed}"]
    dead = [] if c.dead_letters == c.dead_records else [
        f"dead letters {c.dead_letters}, dead records {c.dead_records}"]
    leases = sum(c.leased.values())
    running = [] if c.running == leases and c.running_tenants == c.leased_tenants else [
        f"running {c.running} for {leases} leases; per tenant {c.running_tenants} for"
        f" {c.leased_tenants}"]
    of = f" ({queue})" if queue else ""
    return [
        _verdict(f"ready counter equals the ready lists{of}", ready, f"{c.ready_counter}"),
        _verdict(f"limits' running counts equal the leases{of}", running,
                 f"{c.running} running"),
        _verdict(f"active counters equal the leases, per task{of}", active,
                 f"{sum(c.active.values())} active"),
        _verdict(f"dead-letter set equals the dead records{of}", dead, f"{c.dead_letters}"),
    ]


def _order(ev: Evidence) -> Check:
    """Each run's ledger entries are written by the task itself, and a parent's completed
    run is noted before its acknowledgement, which comes before its children are released:
    so a child's first start must come after its parent's first completed run."""
    first_ok: dict[str, int] = {}
    first_start: dict[str, int] = {}
    for i, e in enumerate(ev.ledger):
        seen = first_ok if e.phase == "ok" else first_start if e.phase in STARTS else None
        if seen is not None:
            seen.setdefault(e.label, i)
    early = [f"{child} started before {parent} completed" for parent, child in ev.edges
             if child in first_start and first_start[child] < first_ok.get(parent, 1 << 62)]
    return _verdict("workflow jobs start only after their parents completed", early,
                    f"{len(ev.edges)} dependencies kept")


def _expiry(ev: Evidence) -> list[Check]:
    """Jobs enqueued with a short ``expires``: none started late, and each ended succeeded
    or expired (a job without one never expires)."""
    # A worker stopped (SIGSTOP) past its lease may begin a run it leased in time after
    # the job's time, when it goes on: that run's lease is lost (the record counts it) and
    # whatever it reports is refused. Only a late start without a lost lease breaks the
    # promise: a lease is never granted past a job's time.
    lost = {j.label: j.lost for j in ev.jobs}
    stale = sorted({e.label for e in ev.ledger if e.phase == "late" and lost.get(e.label)})
    late = sorted({e.label for e in ev.ledger if e.phase == "late"
                   and not lost.get(e.label)})
    wrong = [_describe(j) for j in ev.jobs if j.state == "expired" and j.kind != "expiring"]
    unended = [_describe(j) for j in ev.jobs if j.kind == "expiring"
               and j.state not in ("succeeded", "expired", "cancelled")]
    counts = Counter(j.state for j in ev.jobs if j.kind == "expiring")
    return [
        _verdict("no job started after its expiry", late,
                 f"{counts['succeeded']} started in time, {counts['expired']} expired"
                 + (f"; {len(stale)} stale run(s) of a lost lease began late" if stale
                    else "")),
        _verdict("only jobs with an expiry expire, and each ends succeeded or expired",
                 wrong + unended, "all did"),
    ]


def _waits(ev: Evidence) -> list[Check]:
    waits = [j for j in ev.jobs if j.kind == "wait"]
    wrong = sorted({e.label for e in ev.ledger if e.phase == "wrong"})
    done = {e.label for e in ev.ledger if e.phase == "ok"}
    unresumed = [_describe(j) for j in waits if j.state == "succeeded" and j.label not in done]
    signals = [f"{_describe(j)}: " + ("a signal left unconsumed" if j.signal_left else
                                       "no signal recorded")
               for j in waits if j.state == "succeeded"
               and (j.signal_left or not j.signal_taken)]
    twice = [f"{parent}: {n} children" for parent, n in sorted(ev.children.items()) if n > 1]
    return [
        _verdict("every wait resumed with its own signal and child", wrong + unresumed,
                 f"{sum(j.state == 'succeeded' for j in waits)} of {len(waits)} wait jobs"
                 " resumed and succeeded"),
        _verdict("no signal consumed twice or left unconsumed", signals,
                 f"{sum(j.signal_taken for j in waits)} signals consumed once"),
        _verdict("no child stored twice for one wait", twice,
                 f"{sum(ev.children.values())} children, one per wait"),
    ]


def summarize(ev: Evidence) -> Summary:
    runs = _runs(ev)
    work = [j for j in ev.jobs if j.kind in WORK_KINDS]
    suspended = Counter(e.label for e in ev.ledger if e.phase == "suspend")
    return Summary(
        jobs=len(ev.jobs),
        poison=len(ev.jobs) - len(work),
        runs=sum(runs.values()),
        reexecutions=sum(max(0, runs[j.label] - suspended[j.label] - 1) for j in work),
        lost_leases=sum(max(0, j.attempts + j.refunds + j.unstarted - j.suspends - 1)
                        for j in work),
        bound=sum(f.reach for f in ev.faults),
        lost_jobs=sum(j.state not in FINAL for j in ev.jobs),
        states=dict(Counter(j.state or "missing" for j in ev.jobs)),
        charged_without_run=sum(_charged(j, runs) for j in ev.jobs),
    )


def check(ev: Evidence) -> tuple[list[Check], Summary]:
    """Every promise, held or not, and the figures of the run."""
    summary = summarize(ev)
    runs = _runs(ev)
    per_queue = [check for i, (queue, c) in enumerate(ev.counters.items())
                 for check in _counters(c, queue if i else "")]
    checks = [*_outcomes(ev), *_successes(ev, runs), _bound(summary), *per_queue, _order(ev),
              *_waits(ev), *_expiry(ev)]
    return checks, summary
