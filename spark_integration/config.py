"""Where a Spark task's engine lives and how much memory it may use.

Budget
------
``spark.arrangedb.memoryBudget`` is the budget of one *executor*; it is divided evenly
among the executor's concurrent task slots (``spark.executor.cores /
spark.task.cpus``; in ``local[N]`` the driver is the one executor with N slots), and
each task mounts one engine with its share. The budget is memory of the Python worker,
outside the JVM heap. A Python worker holds its task's share plus
:data:`WORKER_RSS_ALLOWANCE` (the interpreter, pyspark, numpy, pyarrow, pandas, the
engine's code and the work's allowance), so size the container with
``spark.executor.memoryOverhead`` (which covers Python workers and the JVM's own native
memory) >= max(384 MiB, 10% of spark.executor.memory) + memoryBudget + slots x
WORKER_RSS_ALLOWANCE, independently of ``spark.executor.memory`` (the JVM heap, which
arrangedb does not use). Each job's metrics report the worst worker's whole peak as
``max_worker_peak_rss_bytes``.

``spark.executor.pyspark.memory``, when set, is enforced by Spark as an address-space
limit (RLIMIT_AS) on each Python worker. Page files are memory-mapped, and mappings
count against that limit even when not resident; :func:`check_address_space` fails
early with a message saying what to change when the limit leaves too little room.

Spill directory
---------------
``spark.arrangedb.spillDir``, else the executor's own local directories, which the JVM
hands the Python worker as ``SPARK_LOCAL_DIRS`` (the blockmgr directories under
``spark.local.dir``), so Spark's cleanup of an executor covers whatever a killed task
left behind.
"""

from __future__ import annotations

import os
import re
import resource
import weakref
from dataclasses import dataclass

from arrangedb.pager import format_size, parse_size

BUDGET_KEY = "spark.arrangedb.memoryBudget"
SPILL_KEY = "spark.arrangedb.spillDir"
DEFAULT_BUDGET = "512MiB"

WORKER_RSS_ALLOWANCE = 224 << 20
"""What one Python worker holds beside its task's budget, whole (measured on
local-cluster: the worst worker peaked at its task's budget + 119-160 MiB for budgets
of 32-128 MiB; tests/spark_integration/test_spark.py checks the rule on every Spark job it runs)."""


@dataclass(frozen=True)
class TaskConfig:
    """What each task needs, resolved on the driver and shipped in the closure."""
    budget_bytes: int
    spill_dir: str | None
    executor_budget: int
    slots: int
    threads: int = 1   # cores each task may use (spark.task.cpus): sorts use that many


def task_slots(conf: dict, master: str) -> int:
    """Concurrent tasks per executor: executor cores / task cpus."""
    cpus = int(conf.get("spark.task.cpus", "1") or 1)
    cores = conf.get("spark.executor.cores")
    if cores is None:
        m = re.match(r"local\[(\d+|\*)(?:,\d+)?\]", master or "")
        if m:
            cores = os.cpu_count() if m.group(1) == "*" else int(m.group(1))
        else:
            m = re.match(r"local-cluster\[\s*\d+\s*,\s*(\d+)\s*,", master or "")
            cores = int(m.group(1)) if m else (1 if master == "local" else os.cpu_count())
    return max(1, int(cores) // max(cpus, 1))


_CONTEXT_CONF: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def context_conf(sc) -> dict:
    """The SparkContext's configuration, read once: it is fixed when the context starts,
    and copying it over py4j costs ~10 ms a call, several calls a query."""
    conf = _CONTEXT_CONF.get(sc)
    if conf is None:
        conf = _CONTEXT_CONF[sc] = dict(sc.getConf().getAll())
    return conf


def resolve(spark, memory_budget=None, spill_dir=None) -> TaskConfig:
    """The per-task budget and spill directory for jobs of this session."""
    conf = context_conf(spark.sparkContext)
    executor_budget = parse_size(memory_budget if memory_budget is not None
                                 else conf.get(BUDGET_KEY, DEFAULT_BUDGET))
    slots = task_slots(conf, spark.sparkContext.master)
    return TaskConfig(budget_bytes=max(executor_budget // slots, 8 << 20),
                      spill_dir=spill_dir or conf.get(SPILL_KEY),
                      executor_budget=executor_budget, slots=slots,
                      threads=max(1, int(conf.get("spark.task.cpus", "1") or 1)))


def task_spill_root(cfg: TaskConfig) -> str | None:
    """On the worker: the spill root for this task (config, else Spark's local dirs)."""
    if cfg.spill_dir:
        return cfg.spill_dir
    local = os.environ.get("SPARK_LOCAL_DIRS")
    if local:
        for d in local.split(","):
            if d and os.path.isdir(d) and os.access(d, os.W_OK):
                return d
    return None


def check_address_space(budget_bytes: int) -> None:
    """Fail early when RLIMIT_AS (spark.executor.pyspark.memory) cannot hold a task.

    A task needs its budget, the allowance, the address space it already uses, and room
    to map the page files it reads (reads map regions of a part at a time, but the
    files of a batch stay mapped while open): we ask for 4x the budget on top.
    """
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return
    import psutil

    from arrangedb.pager import RSS_ALLOWANCE

    used = psutil.Process().memory_info().vms
    need = used + RSS_ALLOWANCE + 4 * budget_bytes
    if need > soft:
        raise MemoryError(
            f"this Python worker's address space is limited to {format_size(soft)} "
            f"(RLIMIT_AS, set by spark.executor.pyspark.memory) and already uses "
            f"{format_size(used)}; an arrangedb task with a budget of "
            f"{format_size(budget_bytes)} maps page files and needs about "
            f"{format_size(need)}. Unset spark.executor.pyspark.memory and size Python "
            f"memory with spark.executor.memoryOverhead instead, raise it to at least "
            f"{format_size(need)}, or lower {BUDGET_KEY}.")
