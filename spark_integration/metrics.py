"""Per-job metrics from the tasks back to the driver, through a Spark accumulator.

Each task adds one record (rows in and out, bytes spilled, peak RSS over the task's
start against its budget, and the whole Python worker's peak RSS); the driver sees the
sum of counts and the worst task.
"""

from __future__ import annotations

from pyspark.accumulators import AccumulatorParam

_SUMS = ("tasks", "rows_in", "rows_out", "bytes_spilled")
_MAXES = ("max_task_peak_rss_bytes", "max_worker_peak_rss_bytes", "max_task_budget_bytes",
          "max_task_seconds")


class _MetricsParam(AccumulatorParam):
    def zero(self, value):
        return {}

    def addInPlace(self, a, b):
        out = dict(a)
        for k, v in b.items():
            if k in _SUMS:
                out[k] = out.get(k, 0) + v
            elif k in _MAXES:
                out[k] = max(out.get(k, 0), v)
            elif k == "over_budget_tasks":
                out[k] = out.get(k, 0) + v
            elif k == "spill_roots":
                out[k] = sorted(set(out.get(k, [])) | set(v))
        return out


class JobMetrics:
    """Readable after an action on the DataFrame the job returned (``.value``)."""

    def __init__(self, spark):
        self._acc = spark.sparkContext.accumulator({}, _MetricsParam())

    def add_task(self, rows_in: int, rows_out: int, bytes_spilled: int, peak_rss: int,
                 budget: int, allowance: int, seconds: float, spill_root: str = "",
                 worker_peak_rss: int = 0) -> None:
        self._acc.add({"tasks": 1, "rows_in": rows_in, "rows_out": rows_out,
                       "spill_roots": [spill_root], "max_worker_peak_rss_bytes": worker_peak_rss,
                       "bytes_spilled": bytes_spilled, "max_task_peak_rss_bytes": peak_rss,
                       "max_task_budget_bytes": budget, "max_task_seconds": seconds,
                       "over_budget_tasks": int(peak_rss > budget + allowance)})

    @property
    def value(self) -> dict:
        v = {k: 0 for k in _SUMS + _MAXES}
        v["over_budget_tasks"] = 0
        v["spill_roots"] = []
        v.update(self._acc.value)
        return v

    def __repr__(self) -> str:
        return f"JobMetrics({self.value})"
