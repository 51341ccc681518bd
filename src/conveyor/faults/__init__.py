"""Faults on purpose: tools that make the network between conveyor and Redis misbehave,
for the chaos command and for tests (:mod:`conveyor.faults.proxy`)."""
