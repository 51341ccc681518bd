"""Peer-comparison benchmark for conveyor: ``python -m bench.peers``."""
