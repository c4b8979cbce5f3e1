"""Reading: cursors over batches, merged reads and batched lookups."""
