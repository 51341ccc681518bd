import conveyor

EXPECTED = [
    "Advice", "Backlog", "Batch", "BatchItem", "Codec", "ConfigurationError", "Conveyor",
    "ConveyorError",
    "DeadLetters", "EncodingError", "Encryption", "Fail", "Job", "JobCancelled", "JobContext",
    "JobFailed",
    "JobInfo", "JobNotFound", "JobOptions", "JobState", "LeaseLost", "Limits", "Monitor",
    "Node", "NotReplicated", "PartialEnqueue", "PayloadTooLarge", "Queue", "QueueLimits",
    "ResultTimeout", "SerializationError", "Snooze", "Stats", "Task", "TaskActivity",
    "TenantLimits", "Timing", "Unsealable", "WaitTimeout", "Worker", "Workflow", "WorkflowHandle",
    "WorkflowInfo", "__version__", "chain", "current_job",
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
