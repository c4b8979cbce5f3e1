"""Charts of the benchmarks' figures (matplotlib, a development dependency).

``compare_chart``: the join comparison against DuckDB -- seconds per budget, case and
plan, arrangedb beside DuckDB, each pair labelled with the ratio; and the RSS of every
run over time against its budget. ``spark_chart``: the Spark plans' seconds and peak
RSS, each labelled with its ratio to the baseline plan. Both take the result dicts the
benchmarks print, so the charts show the same run as the tables.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")   # files only, never a display

import matplotlib.pyplot as plt  # noqa: E402

from arrangedb.pager import PROCESS_RSS_ALLOWANCE, parse_size  # noqa: E402

MIB = 1 << 20
OURS, THEIRS = "#1f77b4", "#ff7f0e"


def _budget_bytes(budget: str) -> int:
    return parse_size(budget)


def compare_chart(rows: list[dict], raw: dict, path: str, title: str = "") -> str:
    """``rows``: bench/_orders.rows_of() rows (budget, case, plan, arrangedb_seconds, duckdb_seconds,
    ratio);
    ``raw``: {"budget/case": {"arrangedb": figures, "duckdb": figures}} with each run's
    ``rss_timeline``. Writes a PNG to ``path`` and returns it."""
    fig, (bars, lines) = plt.subplots(2, 1, figsize=(12, 9),
                                      gridspec_kw={"height_ratios": [3, 2]})
    labels = [f"{r['budget']}\n{r['case']}\n{r['plan']}" for r in rows]
    xs = range(len(rows))
    width = 0.38
    ours = [r["arrangedb_seconds"] for r in rows]
    theirs = [r["duckdb_seconds"] for r in rows]
    bars.bar([x - width / 2 for x in xs], ours, width, label="arrangedb", color=OURS)
    bars.bar([x + width / 2 for x in xs], theirs, width, label="DuckDB", color=THEIRS)
    for x, r in zip(xs, rows):
        top = max(r["arrangedb_seconds"], r["duckdb_seconds"])
        bars.annotate(f"{r['ratio']:.2f}x", (x, top), textcoords="offset points",
                      xytext=(0, 4), ha="center", fontsize=9, fontweight="bold")
    spread = max(ours + theirs) / max(min(ours + theirs), 1e-9)
    if spread > 20:
        bars.set_yscale("log")
    bars.set_xticks(list(xs), labels, fontsize=8)
    bars.set_ylabel("seconds (lower is better)")
    bars.set_title(title or "arrangedb vs DuckDB; label: DuckDB time / arrangedb time")
    bars.legend()

    budgets_drawn = set()
    for key, systems in sorted(raw.items()):
        budget, case = key.split("/", 1)
        for system, figures in sorted(systems.items()):
            tl = figures.get("rss_timeline") or []
            if not tl:
                continue
            style = "-" if system == "arrangedb" else "--"
            lines.plot([t for t, _ in tl], [b / MIB for _, b in tl], style, linewidth=1,
                       label=f"{system} {budget} {case}")
        if budget not in budgets_drawn:
            budgets_drawn.add(budget)
            limit = _budget_bytes(budget)
            for y, what in ((limit, f"budget {budget}"),
                            (limit + PROCESS_RSS_ALLOWANCE, f"{budget} + the whole-process "
                                                            f"allowance")):
                lines.axhline(y / MIB, color="grey", linestyle=":", linewidth=1)
                lines.text(0.005, y / MIB, what, transform=lines.get_yaxis_transform(),
                           fontsize=8, color="grey", va="bottom")
    lines.set_xlabel("seconds since the run's process started")
    lines.set_ylabel("process RSS, MiB")
    lines.set_title("RSS of each run (setup included) against its budget")
    if lines.get_legend_handles_labels()[0]:
        lines.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def spark_chart(results: dict[str, dict], baseline: str, path: str, title: str = "") -> str:
    """``results``: {system: {"seconds", "peak_tree_rss"}}; ratios are the baseline's
    seconds over each system's. Writes a PNG to ``path`` and returns it."""
    names = list(results)
    base = results[baseline]["seconds"] if baseline in results else None
    fig, (secs, rss) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = [OURS if n.startswith("arrangedb") else THEIRS for n in names]
    secs.barh(names, [results[n]["seconds"] for n in names], color=colors)
    for i, n in enumerate(names):
        s = results[n]["seconds"]
        label = f"{s:.2f}s" + (f"  {base / s:.2f}x" if base else "")
        secs.annotate(label, (s, i), textcoords="offset points", xytext=(3, -3), fontsize=9)
    secs.set_xlabel(f"seconds (label: {baseline} time / this)")
    secs.invert_yaxis()
    rss.barh(names, [results[n]["peak_tree_rss"] / MIB for n in names], color=colors)
    rss.set_xlabel("peak RSS of the process tree, MiB")
    rss.invert_yaxis()
    rss.set_yticks([])
    fig.suptitle(title or "Spark plans")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
