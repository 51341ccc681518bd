"""The sync side of ``_async/``: each module generated from its async source (see
``scripts/generate_sync.py``), except ``io.py``, what differs for real, hand-written."""
