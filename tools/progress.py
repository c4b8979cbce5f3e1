"""Progress bars on a terminal line: for loops we drive, and for Spark stages we watch."""

from __future__ import annotations

import sys
import threading
import time


class Bar:
    """``[#####.....]  52%  label`` redrawn in place (plain lines when not a terminal)."""

    def __init__(self, label: str, out=sys.stderr, width: int = 30):
        self.label, self.out, self.width = label, out, width
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.started = time.time()
        self._last = -1.0

    def update(self, done: float, total: float, detail: str = "") -> None:
        frac = 0.0 if total <= 0 else min(1.0, done / total)
        if not self.tty and frac < 1.0 and frac - self._last < 0.25:
            return   # in a log, a line per quarter is plenty
        self._last = frac
        filled = int(frac * self.width)
        line = (f"{self.label:<28} [{'#' * filled}{'.' * (self.width - filled)}] "
                f"{frac * 100:4.0f}%  {detail}")
        self.out.write(("\r" + line) if self.tty else line + "\n")
        self.out.flush()

    def finish(self, detail: str = "") -> None:
        self.update(1, 1, detail or f"{time.time() - self.started:.1f} s")
        if self.tty:
            self.out.write("\n")
            self.out.flush()


class SparkStages:
    """Watches a SparkContext and draws one bar per stage while a block runs."""

    def __init__(self, sc, label: str, out=sys.stderr, interval: float = 0.5):
        self.sc, self.label, self.out, self.interval = sc, label, out, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._bars: dict[int, Bar] = {}

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=2)
        self._poll(final=True)

    def _poll(self, final=False) -> None:
        tracker = self.sc.statusTracker()
        ids = set(tracker.getActiveStageIds()) | set(self._bars)
        for sid in sorted(ids):
            info = tracker.getStageInfo(sid)
            if info is None:
                continue
            bar = self._bars.get(sid)
            if bar is None:
                bar = self._bars[sid] = Bar(f"{self.label}: stage {sid}", self.out)
            done = info.numCompletedTasks
            if final or (done == info.numTasks and sid not in tracker.getActiveStageIds()):
                if not getattr(bar, "closed", False):
                    bar.closed = True
                    bar.finish(f"{info.numTasks} tasks  {time.time() - bar.started:.1f} s")
            else:
                bar.update(done, info.numTasks, f"{done}/{info.numTasks} tasks")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._poll()
            except Exception:   # the context may be stopping; a progress bar never fails a job
                return
