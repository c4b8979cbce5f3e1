"""The pager: page files on local disk, read through mmap, under a memory budget.

Knows nothing of keys or times -- only bytes, regions, budgets and directories.
"""

from arrangedb.pager.diskio import disk
from arrangedb.pager.budget import PROCESS_RSS_ALLOWANCE, RSS_ALLOWANCE, MemoryBudget
from arrangedb.pager.process_memory import peak_rss, release_freed_memory
from arrangedb.pager.sizing import (GROUP_BY_SHARE, OPERATOR_BUFFER_MIN_BYTES,
                                     OPERATOR_BUFFER_SHARE)
from arrangedb.pager.errors import (BudgetExceeded, CorruptionError, DirectoryLocked,
                                   ManifestError, PageFileError, SpillError)
from arrangedb.pager.leases import Lease, leased
from arrangedb.pager.pagefile import PageFile, PageWriter, RegionInfo
from arrangedb.pager.sizes import format_size, parse_size
from arrangedb.pager.spilldir import SpillDirectory, remove_stale

__all__ = [
    "disk",
    "GROUP_BY_SHARE", "OPERATOR_BUFFER_MIN_BYTES", "OPERATOR_BUFFER_SHARE",
    "PROCESS_RSS_ALLOWANCE", "RSS_ALLOWANCE", "BudgetExceeded", "CorruptionError",
    "DirectoryLocked", "Lease", "ManifestError", "MemoryBudget", "PageFile", "PageFileError",
    "PageWriter", "RegionInfo", "SpillDirectory", "SpillError", "format_size", "parse_size",
    "leased", "peak_rss", "release_freed_memory", "remove_stale",
]
