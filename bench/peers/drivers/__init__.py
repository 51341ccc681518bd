"""Per-peer drivers, run as ``python -m bench.peers.drivers PEER COMMAND`` in the peer's venv.

Each module here defines ``DRIVER`` (a :class:`common.Driver`).  Task functions
live in these modules rather than in ``__main__`` so that peers which import
tasks by dotted path (RQ, Celery, arq, ...) can find them.
"""
