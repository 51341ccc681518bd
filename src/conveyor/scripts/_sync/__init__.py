"""The sync transport: :mod:`.transport` is generated from ``_async/transport.py`` (see
``scripts/generate_sync.py``); :mod:`.io` is what differs from asyncio, hand-written."""
