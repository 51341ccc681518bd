import conveyor

EXPECTED = [
    "Advice", "Backlog", "Codec", "ConfigurationError", "Conveyor", "ConveyorError",
    "DeadLetters", "EncodingError", "Job", "JobCancelled", "JobFailed", "JobInfo", "JobNotFound",
    "JobOptions", "JobState", "Limits", "Monitor", "NotReplicated", "PartialEnqueue",
    "PayloadTooLarge", "Queue", "QueueLimits", "ResultTimeout", "SerializationError", "Stats",
    "Task", "TaskActivity", "TenantLimits", "Timing", "Worker", "__version__",
]


def test_all_is_pinned_and_sorted() -> None:
    assert conveyor.__all__ == sorted(conveyor.__all__)
    assert conveyor.__all__ == EXPECTED
    for name in conveyor.__all__:
        assert hasattr(conveyor, name)


def test_errors_are_catchable_by_builtin_kind() -> None:
    assert issubclass(conveyor.SerializationError, TypeError)
    assert issubclass(conveyor.PayloadTooLarge, ValueError)
    assert issubclass(conveyor.ResultTimeout, TimeoutError)
    assert issubclass(conveyor.JobFailed, conveyor.ConveyorError)
