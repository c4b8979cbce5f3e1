"""Building: runs into batches, fueled merges, the levels of a spine and their merge policy."""
