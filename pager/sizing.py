"""How a budget is shared out, and who gives memory back first: every share and spiller
priority of the engine, in one place.

Shares are divisors of the budget's limit (``limit // share``). The spine and the
operators size their buffers from these; the budget enforces the total.
"""

# Spiller priorities, lowest asked first when a reservation does not fit.
SPILL_CACHES = -1          # the block cache: copies of decoded blocks, dropped at no cost
SPILL_MAPPED_PAGES = 0     # mapped page-file regions: read again from the file when needed
SPILL_RESIDENT_DATA = 1    # resident batches: encoded and written to a page file first

# What sorting one run may hold (its input, the sort's arrays, the sorted copy): half the
# budget, so that the other half holds readers, caches and resident batches.
RUN_SHARE = 2
# Of a run's share: a Parquet input's batches decoded ahead while the run before sorts --
# about one run's input when rows are narrow (a sort holds ~6.5x a 16-byte row's input),
# so that the next run's rows are there when the sort ends: with a sixteenth, arranging
# 40M rows waited ~0.9 s for the reader.
READ_AHEAD_SHARE = 6
# Of a run's share, per row: the batch size an arrange asks an operator's plan for (at
# least the operators' 64k rows): runs then join up few batches before sorting -- 600k
# join changes in 64k-row batches took ~5 ms to concatenate in fresh memory.
PLAN_BATCH_ROW_BYTES = 256
# One resident batch (its sorted updates kept in memory), and all of them together.
RESIDENT_BATCH_SHARE = 16
RESIDENT_TOTAL_SHARE = 4
# The block cache of decoded zstd blocks that lookups come back to.
BLOCK_CACHE_SHARE = 16
# A reader holds one decoded part per source, about twice the part's stored size: the
# read fan-in x 2 x part size is a quarter of the budget.
READERS_SHARE = 4
# A batch read on its own -- a spine merge's output, an arrange's only run -- cuts parts
# up to this many times larger once it spans this many base parts: a settled trace is one
# or two such batches, and each part read carries a fixed cost (its key range looked up,
# decoded, released) that larger parts spread over more rows. Runs that a read walks many
# of at once (an arrange's, merged down to the read fan-in) keep the base size.
LARGE_PART_FACTOR = 4
LARGE_PART_MIN_PARTS = 8
# ... and at most this many large parts fit the readers' share (twice their size each):
# a read meets few large batches, one per spine level past the base parts.
LARGE_PARTS_READ = 4
# group_by's partial aggregates held in memory before they spill through an arrangement.
GROUP_BY_SHARE = 8
# What one operator buffer may hold -- a join's output batch, the open totals of a
# grouping on a dictionary column -- at least OPERATOR_BUFFER_MIN_BYTES: rows of long
# strings then come as fewer rows, not as larger buffers.
OPERATOR_BUFFER_SHARE = 16
OPERATOR_BUFFER_MIN_BYTES = 1 << 20
