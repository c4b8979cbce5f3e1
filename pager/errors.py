"""The pager's errors: each names what was wrong and where."""


class BudgetExceeded(MemoryError):
    """A reservation did not fit in the memory budget even after spilling."""


class SpillError(OSError):
    """The spill directory is missing, unwritable or full."""


class PageFileError(IOError):
    """A page file is foreign, truncated, corrupt or of an unknown version."""
