"""A Spark task's identity and accounting: which partition and attempt it is, and the
engine it mounts with its share of the budget, reported to the driver when it ends."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field


def task_ids() -> tuple[int, int]:
    """(partition, attempt id) of the running task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId(), ctx.taskAttemptId()


def partition_id(batches) -> tuple[int, object]:
    """The running task's partition, and its batches."""
    return task_ids()[0], batches


@dataclass
class Task:
    """Accounting of one task, reported to the driver when the partition ends."""
    cfg: object
    metrics: object
    rows_in: int = 0
    rows_out: int = 0
    started: float = field(default_factory=time.time)

    def engine(self):
        from arrangedb import Engine
        from arrangedb.spark_integration.config import check_address_space, task_spill_root
        from arrangedb.codecs import set_threads

        check_address_space(self.cfg.budget_bytes)
        set_threads(self.cfg.threads)   # the other cores run the other slots' tasks
        return Engine(spill_dir=task_spill_root(self.cfg), memory_budget=self.cfg.budget_bytes)

    def report(self, engine) -> None:
        if self.metrics is None:
            return
        from arrangedb.pager import RSS_ALLOWANCE, peak_rss

        s = engine.stats()
        # the whole worker's high-water mark, what the container sees: the kernel's
        # (the interpreter, pyspark, numpy, pyarrow and pandas included), or the
        # engine's sampled peak if that was higher
        worker_peak = max(peak_rss() or 0, s["peak_rss_bytes"])
        self.metrics.add_task(self.rows_in, self.rows_out, s["bytes_spilled"],
                              s["peak_rss_bytes"] - s["baseline_rss_bytes"],
                              self.cfg.budget_bytes, RSS_ALLOWANCE, time.time() - self.started,
                              os.path.dirname(engine.spill.path), worker_peak)


class Refused(ValueError):
    """A task's refusal of its input (one line, what the user can change): the driver
    raises it as a ValueError (:func:`raise_refusal`), not as Spark's wrapped error."""


_REFUSED = re.compile(rf"{re.escape(Refused.__module__)}\.Refused: ([^\n]*)")


def raise_refusal(error: BaseException) -> None:
    """If a failed job's ``error`` comes from a task's :class:`Refused`, raise it as a
    ValueError on the driver; else return."""
    found = _REFUSED.search(str(error))
    if found:
        raise ValueError(found.group(1)) from error
