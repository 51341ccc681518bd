"""Applications that tests run in real worker processes (``conveyor worker apps.<name>:app``)."""
