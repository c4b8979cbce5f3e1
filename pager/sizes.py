"""Byte sizes as people write them: 1000, "512MiB", "2g", "1.5 GB".

Binary units (KiB, MiB, GiB, TiB) and Spark-style single letters (k, m, g, t) mean
powers of 1024; two-letter decimal units (KB, MB, GB, TB) mean powers of 1000, as in
DuckDB's memory_limit. A bare number is bytes.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "kb": 10**3,
    "m": 1 << 20, "mib": 1 << 20, "mb": 10**6,
    "g": 1 << 30, "gib": 1 << 30, "gb": 10**9,
    "t": 1 << 40, "tib": 1 << 40, "tb": 10**12,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value) -> int:
    """Bytes from an int or a size string; ValueError naming the bad value otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative: {value!r}")
        return value
    if isinstance(value, float) and value >= 0:
        return int(value)
    if isinstance(value, str):
        m = _PATTERN.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    raise ValueError(
        f"not a size: {value!r} (use bytes as an int, or a string such as '512MiB', '2g', '1GB')")


def format_size(nbytes: float) -> str:
    """A short human form with binary units: 1536 -> '1.5 KiB'."""
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
