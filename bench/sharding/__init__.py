"""Sharded queues: ``python -m bench.sharding``.

What decides a sharded queue's ceiling, measured on a private 3-primary Redis Cluster
(started in a temporary folder, the tests' ``RedisCluster``), one queue alternately
unsharded (1 shard) and spread over 3 shards (``set_shards(3)``, one per primary):

* **server CPU per job**: ``--jobs`` nearly free jobs (an ``async def`` that returns)
  stored with ``enqueue_many`` in calls of 1,000, then drained by two burst worker
  processes (concurrency 64 each); each primary's ``INFO cpu`` (user + sys, the whole
  process) read before the enqueue and after the workers left, less the primary's idle
  burn (cluster bus, timers) over the same time, measured on the quiet cluster at the
  start (and reported again at the end). Summed over the primaries and per primary, in µs
  per job, beside the Redis commands and script calls per job (``INFO commandstats``);
  the ratio sharded / unsharded per pair of runs (target <= 1.15). The same drain on one
  plain redis-server, all shards on it, tells what the sharding costs conveyor itself
  apart from the load being spread over three servers on a machine of two cores;
* **spread**: jobs per shard (from the job ids) and each primary's part of the server CPU,
  against an even share (target: every shard within +-10 %); jobs without a tenant, and
  the same jobs spread over ``--tenants`` tenants (placed by a hash of the tenant);
* **projected ceiling**: 1 s over the server CPU per job of the busiest primary (one core
  per primary), for 1 and 3 primaries as measured and 6 projected, beside the drain rate
  this 2-core machine measured (bounded by its cores, shared by every process, not by
  any one primary);
* **priority across shards**: ``--priority-jobs`` jobs enqueued one by one, 20 % at
  priority 8 and 80 % at 2 in a random order, while one worker (concurrency 4, 2 ms per
  job) drains them more slowly than they come; from each job's record (priority, enqueued
  and started, the servers' clocks) the claims per thousand that took a job while a job
  of higher priority, ready since ``bound`` before, started later (target <= 10 at 50 ms);
* **an idle worker**: Redis commands and server CPU per second over ``--idle`` seconds
  with one worker serving the empty queue, unsharded and sharded.

Every run also checks that each job ran once (the monitor's started and succeeded counts,
shard by shard). Medians of ``--runs`` alternated runs with min-max.
"""
