"""A census of a live process's Python objects, by what holds them (BENCH_CENSUS=1 in the in-cluster benches).

tracemalloc says where memory was allocated and slows the service several times over; a census says what
holds it now and costs a few seconds once. Every object the collector tracks, and each object reachable
from one (strings, bytes, numbers, untracked tuples), is counted once with `sys.getsizeof`, under its
owner: the first object of a class other than a plain container (dict, list, tuple, set, frozenset,
deque) found by walking up from it through the referrer first seen. So a string in a dict in a
`ProxyObject` counts as `ProxyObject <- dict <- str`. Objects only C code holds (a pydantic-core
validator's internals, a C extension's buffers) are not seen; pymalloc's own view of its arenas is
appended (`sys._debugmallocstats`), which shows how much of the RSS is free space kept by the allocator.
"""

from __future__ import annotations

import bisect
import collections
import gc
import io
import os
import sys
import tempfile
import types
from xml.etree import ElementTree

PLAIN = (dict, list, tuple, set, frozenset, collections.deque)
SKIP = (type, types.ModuleType, types.FunctionType, types.CodeType)


def census(path: str, *, top: int = 40) -> None:
    """Write the census to `path` (a text report)."""
    gc.collect()
    allocator = _mallocstats() + _mallinfo() + _free_chunks()  # before the census's own maps fill them
    allocator += _trim_probe()  # what glibc's free space would give back (the census's maps come after)
    tracked = gc.get_objects()
    owner: dict[int, object] = {}
    seen: dict[int, object] = {id(o): o for o in tracked}
    queue = list(tracked)
    while queue:
        obj = queue.pop()
        for ref in gc.get_referents(obj):
            key = id(ref)
            if key not in owner:
                owner[key] = obj
            if key not in seen:
                seen[key] = ref
                queue.append(ref)
    by_type: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    by_root: collections.Counter[str] = collections.Counter()
    root_counts: collections.Counter[str] = collections.Counter()
    by_holder: collections.Counter[str] = collections.Counter()
    holder_counts: collections.Counter[str] = collections.Counter()
    copies: dict[object, int] = {}  # a str or bytes value -> the objects seen holding it
    spare: collections.Counter[str] = collections.Counter()  # holder -> bytes of copies beyond the first
    spare_counts: collections.Counter[str] = collections.Counter()
    total = 0
    for key, obj in seen.items():
        if obj is seen or obj is owner or obj is tracked or obj is queue:
            continue
        try:
            size = sys.getsizeof(obj)
        except TypeError:
            continue
        total += size
        name = type(obj).__qualname__
        by_type[name] += size
        counts[name] += 1
        chain = _holder(key, obj, owner)
        by_holder[chain] += size
        holder_counts[chain] += 1
        root = chain.split(" <- ", 1)[0]
        by_root[root] += size
        root_counts[root] += 1
        if type(obj) in (str, bytes) and len(obj) >= 8:  # type: ignore[arg-type]
            held = copies.get(obj, 0)
            copies[obj] = held + 1
            if held:
                spare[chain] += size
                spare_counts[chain] += 1
    out = io.StringIO()
    out.write(f"census of pid {os.getpid()}: {len(seen):,} objects, {total / 2**20:.1f} MiB by getsizeof\n")
    out.write("by type:\n")
    _table(out, by_type, counts, top)
    out.write("by holder, summed (the nearest object that is not a plain container, with all below it):\n")
    _table(out, by_root, root_counts, top)
    out.write("by holder (the nearest object that is not a plain container, then the containers down):\n")
    _table(out, by_holder, holder_counts, top * 2)
    wasted = sum(spare.values())
    out.write(f"equal str and bytes values held twice or more: {wasted / 2**20:.1f} MiB of copies:\n")
    _table(out, spare, spare_counts, top // 2)
    out.write("the allocators before the census (pymalloc's totals, sys._debugmallocstats; glibc's):\n")
    out.write(allocator)
    modules = sorted(sys.modules)
    out.write(f"modules loaded: {len(modules)}\n{' '.join(modules)}\n")
    with open(path + ".tmp", "w") as file:
        file.write(out.getvalue())
    os.replace(path + ".tmp", path)


def _mallinfo() -> str:
    """glibc's own heap (objects over 512 bytes, C extensions' memory): in use, free, mapped apart."""
    try:
        import ctypes

        class Info(ctypes.Structure):
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

        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Info
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return "glibc's mallinfo2: not available\n"
    mib = 2**20
    return (
        f"glibc heap (mallinfo2, all arenas): {info.arena / mib:.1f} MiB in its heaps, "
        f"{info.uordblks / mib:.1f} MiB in use, {info.fordblks / mib:.1f} MiB free, "
        f"{info.hblkhd / mib:.1f} MiB in {info.hblks} mmapped blocks\n"
    )


def _free_chunks() -> str:
    """glibc's free chunks by size (malloc_info's XML, all heaps): what `malloc_trim` cannot give back is
    free space in chunks smaller than a page, between chunks in use."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        with tempfile.NamedTemporaryFile("r", suffix=".xml") as xml:
            stream = libc.fopen(xml.name.encode(), b"w")
            if not stream:
                return "malloc_info: not available\n"
            libc.malloc_info(0, stream)
            libc.fclose(stream)
            text = xml.read()
    except (OSError, AttributeError):
        return "malloc_info: not available\n"
    bounds = (512, 1024, 4096, 65536)
    totals = [0] * (len(bounds) + 1)
    counts = [0] * (len(bounds) + 1)
    heaps = ElementTree.fromstring(text).findall("heap")  # the totals of all heaps come after: not summed
    for heap in heaps:
        for size in heap.iterfind("sizes/size"):  # the bins by size ("unsorted" left out)
            index = bisect.bisect_left(bounds, int(size.get("to", 0)))  # the first bound >= its top
            totals[index] += int(size.get("total", 0))
            counts[index] += int(size.get("count", 0))
    labels = ("<=512 B", "513 B-1 KiB", "1-4 KiB", "4-64 KiB", ">64 KiB")
    parts = ", ".join(
        f"{label} {total / 2**20:.1f} MiB ({count:,})"
        for label, total, count in zip(labels, totals, counts, strict=True)
    )
    return f"glibc free chunks by size (malloc_info, {len(heaps)} heaps): {parts}\n"


def _rss_kib() -> int:
    with open("/proc/self/status") as file:
        for line in file:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _trim_probe() -> str:
    """RSS before and after glibc's `malloc_trim(0)`: how much of glibc's free space it hands back."""
    try:
        import ctypes
        import time

        libc = ctypes.CDLL("libc.so.6")
        before = _rss_kib()
        started = time.perf_counter()
        libc.malloc_trim(0)
        took = time.perf_counter() - started
        after = _rss_kib()
    except (OSError, AttributeError):
        return "malloc_trim: not available\n"
    return (
        f"malloc_trim(0): RSS {before / 1024:.1f} -> {after / 1024:.1f} MiB in {took * 1000:.1f} ms; "
        f"after it: {_mallinfo()}"
    )


def _mallocstats() -> str:
    """The totals of `sys._debugmallocstats` (it writes to the C stderr)."""
    with tempfile.TemporaryFile("w+") as file:
        saved = os.dup(2)
        try:
            os.dup2(file.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        file.seek(0)
        return "".join(line for line in file if line.startswith(("#", "Total")) or "arenas *" in line)


def _holder(key: int, obj: object, owner: dict[int, object]) -> str:
    """`Class <- container <- ... <- type of obj`, walking up from obj through its first referrer."""
    path = [type(obj).__qualname__]
    current = owner.get(key)
    for _ in range(6):
        if current is None:
            return " <- ".join(["(no referrer)", *reversed(path)])
        if isinstance(current, SKIP):
            # Not asked of a module (it has none): a PEP 562 __getattr__ (service/lean_packages.py's
            # deferred packages) would run the package's __init__, and the census list what that imported
            name = "" if isinstance(current, types.ModuleType) else getattr(current, "__qualname__", "")
            label = f"{type(current).__qualname__} {name}".strip()
            return " <- ".join([label, *reversed(path)])
        if not isinstance(current, PLAIN):
            return " <- ".join([type(current).__qualname__, *reversed(path)])
        path.append(type(current).__qualname__)
        current = owner.get(id(current))
    return " <- ".join(["...", *reversed(path)])


Sizes = collections.Counter[str]


def _table(out: io.StringIO, sizes: Sizes, counts: Sizes, top: int) -> None:
    for name, size in sizes.most_common(top):
        out.write(f"  {size / 2**20:8.2f} MiB {counts[name]:10,d}  {name}\n")


def install(path_variable: str = "BENCH_CENSUS_FILE") -> None:
    """SIGUSR2 writes a census to the file named by `path_variable`."""
    import signal

    signal.signal(signal.SIGUSR2, lambda *_: census(os.environ[path_variable]))
