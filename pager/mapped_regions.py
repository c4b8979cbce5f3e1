"""Mapped regions: which page-file regions a budget keeps mapped in memory.

Every region a reader maps is charged to the budget of the page file it belongs to,
in the order it was mapped. Under pressure the least recently mapped regions are
released first (``madvise(MADV_DONTNEED)``); their pages come back from the file when
read again, and are checked again then, since they may come from the disk. Mechanism
(mapping, releasing, checking) is :mod:`arrangedb.pager.pagefile`'s; this module is
the policy of which regions go.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict

from arrangedb.pager.sizing import SPILL_MAPPED_PAGES


class MappedRegions:
    """Mapped regions charged to one budget, least recently mapped first."""

    _by_budget: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
    _guard = threading.Lock()

    def __init__(self, budget):
        self.budget = budget
        self.regions: OrderedDict = OrderedDict()   # (pagefile key, name) -> (ref, length)
        self.released: weakref.WeakSet = weakref.WeakSet()   # page files   # to sweep
        self.token = budget.add_spiller(self.spill, priority=SPILL_MAPPED_PAGES)

    @classmethod
    def of(cls, budget) -> "MappedRegions":
        with cls._guard:
            rs = cls._by_budget.get(budget)
            if rs is None:
                rs = cls._by_budget[budget] = cls(budget)
            return rs

    def spill(self, wanted: int) -> int:
        freed = 0
        while self.regions and freed < wanted:
            (_, name), (ref, length) = self.regions.popitem(last=False)
            pf = ref()
            if pf is None:   # dropped without close(): its mapping is gone, so is the charge
                self.budget.release(length, "mapped pages")
                freed += length
                continue
            # its pages come back from the file, maybe from the disk: check them again
            freed += pf.release(name, reverify=True)
        self.sweep()
        return freed

    def sweep(self) -> None:
        """Drop the pages mapped beside the regions released since the last sweep."""
        for pf in list(self.released):
            pf.sweep()
        self.released.clear()
