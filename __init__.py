"""arrangedb: a spill-to-disk, paged storage engine for differential-dataflow arrangements."""

__version__ = "0.1.0"
