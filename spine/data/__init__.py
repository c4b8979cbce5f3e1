"""Data kernels: updates and their sort order, consolidation, leaf layouts, stream roles,
input reading."""
