"""The benchmark charts are drawn from result dicts like the benchmarks' own."""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("matplotlib")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "bench"))

import plots  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_join_chart_is_drawn_with_every_run(tmp_path):
    rows = [{"budget": b, "case": c, "plan": p, "arrangedb_seconds": s, "duckdb_seconds": d,
             "ratio": d / s}
            for b in ("512MiB", "128MiB")
            for c, p, s, d in (("cold", "plain", 4.3, 1.8), ("warm", "fused", 0.15, 1.5))]
    timeline = [(0.05 * i, (100 + i) << 20) for i in range(50)]
    raw = {f"{b}/{c}": {"arrangedb": {"rss_timeline": timeline},
                        "duckdb": {"rss_timeline": timeline}}
           for b in ("512MiB", "128MiB") for c in ("cold", "warm")}
    path = plots.compare_chart(rows, raw, str(tmp_path / "join.png"))
    with open(path, "rb") as f:
        assert f.read(8) == PNG
    assert os.path.getsize(path) > 20_000


def test_the_spark_chart_labels_ratios_to_its_baseline(tmp_path):
    results = {"spark sort-merge join": {"seconds": 11.4, "peak_tree_rss": 1930 << 20},
               "arrangedb reused": {"seconds": 0.63, "peak_tree_rss": 1480 << 20}}
    path = plots.spark_chart(results, "spark sort-merge join", str(tmp_path / "spark.png"))
    with open(path, "rb") as f:
        assert f.read(8) == PNG
