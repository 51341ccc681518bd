"""Code written once for asyncio: ``_sync/`` holds the sync side generated from it (see
``scripts/generate_sync.py``), and ``io.py`` in each is what differs for real."""
