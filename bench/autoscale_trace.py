"""A scaling trace: how ``conveyor worker --autoscale`` follows a burst of jobs.

Starts a private redis-server, runs the supervisor on this module's app with
``--autoscale 1:4``, lets it settle, enqueues a burst that one worker process would need
about a minute to drain, and samples twice a second: backlog (ready jobs), jobs running,
the p95 wait of recently started jobs, and live worker processes. Prints the trace and the
supervisor's decisions.

    python -m bench.autoscale_trace [--jobs 1200] [--run 0.1] [--autoscale 1:4]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import conveyor
from conveyor.fleet.autoscale import SignalReader
from conveyor.fleet.published import live_supervisors
from conveyor.worker.registry import live_workers

QUEUE = "emails"
IDLE_THRESHOLD = 3.0
ROOT = Path(__file__).resolve().parents[1]

app = conveyor.Conveyor(namespace=os.environ.get("TRACE_NAMESPACE", "trace"))


@app.task(name="trace.send_email", queue=QUEUE, idle_threshold=IDLE_THRESHOLD)
def send_email(user_id: int, seconds: float) -> int:
    """A transactional email: mostly waiting on the mail server."""
    time.sleep(seconds)
    return user_id


def command() -> list[str]:
    script = Path(sys.executable).with_name("conveyor")
    return [str(script)] if script.exists() else [
        sys.executable, "-c", "from conveyor.cli import main; main()"]


def sample(reader: SignalReader, began: float) -> tuple[float, int, int, float | None, int]:
    sec, usec = app.redis.time()
    ready, p95 = reader.backlog(sec + usec / 1e6)
    running = int(app.redis.zcard(app.keys(QUEUE).leases))
    children = len(live_workers(app))
    return time.monotonic() - began, ready, running, p95, children


def run(args: argparse.Namespace, url: str) -> None:
    app.url = url
    app.close()
    env = dict(os.environ, CONVEYOR_REDIS_URL=url, TRACE_NAMESPACE=app.namespace,
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]))
    log_path = Path(tempfile.mkdtemp(prefix="conveyor-trace-")) / "supervisor.log"
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(
            [*command(), "-v", "worker", "bench.autoscale_trace:app", "-q", QUEUE,
             "-c", str(args.concurrency), "--autoscale", args.autoscale,
             "--target-wait", str(args.target_wait)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    low = int(args.autoscale.split(":")[0])
    reader = SignalReader(app, [QUEUE], args.target_wait)
    try:
        deadline = time.monotonic() + 30
        while len(live_workers(app)) < low:
            if time.monotonic() > deadline:
                raise SystemExit(f"the workers did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        began = time.monotonic()
        rows = [sample(reader, began)]
        send_email.enqueue_many([(n, args.run) for n in range(args.jobs)])
        print(f"burst: {args.jobs} jobs of {args.run} s at t=0 (one process, -c"
              f" {args.concurrency}, would need {args.jobs * args.run / args.concurrency:.0f} s)")
        print(f"{'t (s)':>6} {'backlog':>8} {'running':>8} {'p95 wait (s)':>13} {'children':>9}")
        drained_at = None
        while time.monotonic() - began < args.limit:
            row = sample(reader, began)
            rows.append(row)
            t, ready, running, p95, children = row
            print(f"{t:6.1f} {ready:8d} {running:8d} "
                  f"{'-' if p95 is None else f'{p95:.2f}':>13} {children:9d}", flush=True)
            if drained_at is None and ready == 0 and running == 0:
                drained_at = t
            if drained_at is not None and children <= low:
                break
            time.sleep(args.interval)
        summarise(rows, drained_at, args)
    finally:
        proc.terminate()
        proc.wait(60)


def summarise(rows: list[tuple[float, int, int, float | None, int]], drained_at: float | None,
              args: argparse.Namespace) -> None:
    high = int(args.autoscale.split(":")[1])
    at_max = next((r for r in rows if r[4] >= high), None)
    if at_max is not None:
        print(f"reached {high} processes at t={at_max[0]:.1f} s with {at_max[1]} jobs still"
              " ready")
    if drained_at is not None:
        print(f"burst drained at t={drained_at:.1f} s; back to the minimum at"
              f" t={rows[-1][0]:.1f} s")
    for sup in live_supervisors(app, decisions=20):
        print("decisions (oldest first):")
        for d in reversed(sup.decisions):
            print(f"  {time.strftime('%H:%M:%S', time.gmtime(d['at']))} {d['kind']}: {d['text']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1200)
    parser.add_argument("--run", type=float, default=0.1, help="seconds per job")
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--autoscale", default="1:4")
    parser.add_argument("--target-wait", type=float, default=2.0)
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--limit", type=float, default=120.0, help="longest trace, seconds")
    args = parser.parse_args()
    url = os.environ.get("CONVEYOR_REDIS_URL")
    if url:
        run(args, url)
        return
    from .peers.redis_server import private_redis

    with private_redis() as server:
        run(args, server.url)


if __name__ == "__main__":
    main()
