"""The spine: arrangements as traces of sorted, immutable batches.

The sub-packages follow the data: ``data`` (updates, their sort order, consolidation,
leaf layouts, stream roles, input reading), ``storage`` (parts in memory and in page
files, batches, resident batches, the block cache), ``build`` (runs, merges, the levels
of a spine and their merge policy), ``read`` (cursors, merged reads, batched lookups)
and ``persist`` (checkpoints). ``trace`` and ``engine`` are the public face.

What this module exports is the surface the operators (:mod:`arrangedb.ops`) and the
Spark integration use; they import nothing else of the spine.
"""

from arrangedb.spine.data import roles
from arrangedb.spine.data.ingest import Columns, SchemaError, convertible, open_batches
from arrangedb.spine.data.kernels import consolidate, count_through
from arrangedb.spine.data.layout import ranges, run_index
from arrangedb.spine.data.codes import absolute_codes, codes, is_absolute
from arrangedb.spine.data.order import is_identity, sort_rows
from arrangedb.spine.data.updates import Updates, all_equal, is_constant
from arrangedb.spine.read.cursor import (Block, batch_part_blocks, blocks, co_blocks,
                                         holds_nulls, may_change, part_blocks)
from arrangedb.spine.read.signs import nonnegative_at
from arrangedb.spine.storage.batch import payload_per_update
from arrangedb.spine.storage.dictionaries import dictionary_schema
from arrangedb.spine.build.exertion import together
from arrangedb.spine.handle import TraceHandle
from arrangedb.spine.trace import Trace
from arrangedb.spine.engine import Engine, engine_for

__all__ = [
    "Block", "Columns", "Engine", "SchemaError", "Trace", "TraceHandle", "Updates",
    "absolute_codes", "convertible", "is_absolute",
    "batch_part_blocks", "blocks", "co_blocks", "codes", "consolidate", "count_through",
    "all_equal", "dictionary_schema", "engine_for", "holds_nulls", "is_constant",
    "is_identity", "may_change",
    "nonnegative_at",
    "open_batches",
    "part_blocks", "payload_per_update", "ranges", "roles", "run_index",
    "sort_rows", "together",
]
