"""The bytes of a page file: those written, and those it occupies on disk.

A page file is its header, its regions and its directory, with gaps between them: up to
63 bytes of padding before each region and before the directory (64-byte alignment), and
before a region aligned to a page or a MiB, a gap that is a hole past the page it starts
in -- no disk, no page cache (``du`` does not count it either).
"""

from __future__ import annotations


def _up(n: int, to: int) -> int:
    return -(-n // to) * to


def written_bytes(size: int, regions, header: int, align: int) -> int:
    """Header, regions and directory (which starts aligned after the last region): the
    file's bytes without any gap."""
    regions = list(regions)
    directory_at = _up(max((r.offset + r.length for r in regions), default=header), align)
    return header + sum(r.length for r in regions) + size - directory_at


def occupied_bytes(size: int, regions, header: int, page: int) -> int:
    """The file's size less its holes: of each gap, the bytes past the page it starts in."""
    pos, holes = header, 0
    for offset, end in sorted((r.offset, r.offset + r.length) for r in regions):
        holes += max(0, offset - _up(pos, page))
        pos = max(pos, end)
    return size - holes
