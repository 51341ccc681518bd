"""The async transport, the one written by hand: ``_sync/transport.py`` is generated from
:mod:`.transport` (see ``scripts/generate_sync.py``); :mod:`.io` is what differs from the
sync side, hand-written on both."""
