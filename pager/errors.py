"""The pager's errors: each names what was wrong and where."""


class BudgetExceeded(MemoryError):
    """A reservation did not fit in the memory budget even after spilling."""


class SpillError(OSError):
    """The spill directory is missing, unwritable or full."""


class CorruptionError(IOError):
    """A stored file fails its checks: foreign, truncated, damaged, missing or of an
    unknown format version. The message names the file."""


class PageFileError(CorruptionError):
    """A page file is foreign, truncated, corrupt or of an unknown version."""


class ManifestError(CorruptionError):
    """A saved trace's manifest is damaged, of an unknown format, or names page files
    that do not match it."""


class DirectoryLocked(OSError):
    """Another writer (a process, or another engine of this one) is writing into the
    directory; the message names its process id and host."""
