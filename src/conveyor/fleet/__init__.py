"""The process fleet: the supervisor that runs N worker processes on one machine, the
children it starts, and the autoscaler that decides how many there should be.

What one worker process runs (its loops, leases, executor, outbox) lives in
:mod:`conveyor.worker`; this package starts, watches, replaces and scales such processes.
Imports point one way: the fleet uses the worker, the worker never uses the fleet, and
neither uses the CLI or the dashboard (they use both).

This package imports nothing on its own, so that a child (``python -m
conveyor.fleet.child``) starts without loading the supervisor's modules.
"""
