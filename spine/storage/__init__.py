"""Storage: parts in memory and in page files, batches, resident batches, the block cache."""
