"""Checkpoints: a trace made durable in a directory, version by version, differentially.

Design
------
A checkpoint directory holds immutable page files (one per batch) and one manifest per
version, ``manifest-<version>.json``: the key and val schemas, the roles of the columns,
the compaction frontier, and for every batch its description, its page file (name,
size, directory checksum) and its parts' directory (counts, byte sizes, first and last
key, the regions of each column). Batches are immutable, so a version shares every file
it can with the version before: a checkpoint writes only the batches the directory does
not hold yet, and a small manifest. Each batch in memory remembers which files of its
directory hold its updates (``Batch.checkpointed``); a merge of such batches inherits
their files (:func:`inherit`), so background merging does not turn the next small
checkpoint into a rewrite of the whole trace. The policy: a merged batch keeps
referencing its inputs' files while they hold at most ``REWRITE_RATIO`` times its own
stored bytes (retractions consolidated away make them larger) and number at most
``MAX_INHERITED`` files; past that, the next checkpoint writes it anew.

Loading maps the version's page files in place (no payload is decoded) and holds a
lease on them (:mod:`arrangedb.pager.leases`) while the trace is open.

Invariants
----------
- Order of writes: the directory's own entry (and its parents', where a first
  checkpoint makes them) fsync'd; page files, each fsync'd; the directory fsync'd; the
  manifest under a temporary name, fsync'd, renamed, the directory fsync'd. A version
  exists once its manifest does; a crash at any instant leaves the last completed
  version (or the new one, if its rename reached the disk), never a mix. Leftovers are
  removed by the next writer (temporary files, and files no manifest names).
- One writer per directory (:class:`arrangedb.pager.dirlock.DirectoryLock`): a trace
  holds the writer role from its first checkpoint into a directory until it is closed.
  A trace checkpoints only on top of the version it was loaded from or last wrote; a
  trace of another schema, or one whose base the directory moved past, is refused.
- Retention keeps the newest ``retain`` versions. A page file is deleted only when no
  retained manifest names it, no live lease holds it, and the writer's own trace does
  not read it.
- Files are new files under names no earlier checkpoint used, created with ``O_EXCL``,
  never hard links to spill files: nothing ever truncates or rewrites a file a reader
  may map. They take the permissions the umask gives.
- Every manifest carries an XXH3-64 checksum of its canonical JSON and the identity of
  each page file it names: damage or swapped files are reported (``ManifestError``,
  ``PageFileError``) naming the file and the version.
- ``manifest.json`` (formats 1 and 2: one saved version, written before versions
  existed) still loads.
"""

from arrangedb.spine.persist.load import is_checkpoint_dir, load, versions
from arrangedb.spine.persist.manifest import (CheckpointConflict, list_versions,
                                              manifest_name, read_manifest)
from arrangedb.spine.persist.write import CheckpointState, checkpoint, inherit

__all__ = ["CheckpointConflict", "CheckpointState", "checkpoint", "inherit",
           "is_checkpoint_dir", "list_versions", "load", "manifest_name", "read_manifest",
           "versions"]
