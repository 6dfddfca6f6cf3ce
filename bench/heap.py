"""Where a process's heap goes: the allocators' own counts, beside RSS.

RSS after a wave mixes live objects with the holes freed objects leave, in two allocators:
pymalloc (Python objects of up to 512 bytes, in 1 MiB arenas an arena returned only when
all of it is free) and glibc malloc (the rest, e.g. a 1.2 KB text or a compressed chunk).
``heap_stats`` reads both, so a change in RSS per agent can be told apart as live bytes
(``pymalloc_used``, ``malloc_used``) or holes (``pymalloc_free``, ``malloc_free``).
``emit_growth`` says which allocation sites the live Python bytes grew at (tracemalloc).

Used by ``workload.py --heap``, ``--trim`` and ``--tracemalloc``; nothing here runs otherwise.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import sys
import tempfile
import tracemalloc

__all__ = ["emit_growth", "heap_stats", "trim"]


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> _Mallinfo2:
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _Mallinfo2
    info: _Mallinfo2 = libc.mallinfo2()
    return info


def _pymalloc_stats() -> dict[str, int]:
    """``sys._debugmallocstats``'s totals (it writes to the C stderr: read back from a file)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as out:
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode()

    def number(pattern: str) -> int:
        found = re.search(pattern + r"\s*=\s*([\d,]+)", text)
        return int(found.group(1).replace(",", "")) if found else -1

    return {
        "pymalloc_arenas": number(r"arenas \* \d+ bytes/arena"),
        "pymalloc_used": number(r"# bytes in allocated blocks"),
        "pymalloc_free": number(r"# bytes in available blocks")
        + number(r"unused pools \* \d+ bytes"),
    }


def trim() -> None:
    """``malloc_trim(0)``: glibc hands back every whole free page inside its heaps, so RSS
    after it no longer counts the holes a wave's peak left (what is left is live bytes,
    pymalloc's arenas and holes smaller than a page)."""
    ctypes.CDLL(None).malloc_trim(0)


def heap_stats() -> dict[str, int]:
    """Bytes each allocator holds now: used by live blocks, and free inside its memory."""
    info = _mallinfo2()
    return {
        "malloc_used": info.uordblks,
        "malloc_free": info.fordblks,
        "malloc_mmap": info.hblkhd,
        **_pymalloc_stats(),
    }


def emit_growth(
    first: tuple[int, tracemalloc.Snapshot], last: tuple[int, tracemalloc.Snapshot]
) -> None:
    """Live Python bytes per added agent between two waves, by allocation site: what the
    idle agents themselves hold, apart from the heap's holes (which RSS counts and this
    does not). One ``growth`` line a site, largest first, then the total."""
    agents = last[0] - first[0]
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old, new = (s.filter_traces(ignore) for _, s in (first, last))
    stats = new.compare_to(old, "traceback")
    for stat in stats[:25]:
        frames = [f"{f.filename}:{f.lineno}" for f in stat.traceback]
        growth = {
            "bytes_per_agent": stat.size_diff / agents,
            "blocks_per_agent": stat.count_diff / agents,
            "frames": frames,
        }
        print(json.dumps({"growth": growth}), flush=True)
    total = sum(s.size_diff for s in stats) / agents
    blocks = sum(s.count_diff for s in stats) / agents
    growth = {"bytes_per_agent": total, "blocks_per_agent": blocks}
    print(json.dumps({"growth_total": growth}), flush=True)
