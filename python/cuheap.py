"""cuheap's host pool as the allocator of PyTorch and CuPy.

One pool per device for the process (libcuheap.so, built with
``cargo build --release -p cuheap-capi``), behind PyTorch's
``CUDAPluggableAllocator`` and CuPy's ``CFunctionAllocator``::

    import cuheap
    cuheap.use_in_torch()   # before PyTorch allocates on the GPU
    cuheap.use_in_cupy()    # any time; arrays allocated before keep their memory

The library is found at ``$CUHEAP_LIB`` (the file), else in
``target/release`` of the source tree this file sits in, else beside this
file.

What changes for the framework:
- PyTorch: blocks are stream-ordered on the stream PyTorch allocates for;
  a tensor freed is reused at once by work on that stream, by other
  streams after the device finishes that stream's work so far (no host
  wait). PyTorch's own statistics (``torch.cuda.memory_allocated`` and
  the like) and ``torch.cuda.empty_cache()`` do not reach a pluggable
  allocator, nor does ``Tensor.record_stream``: use :func:`stats` and
  :func:`trim`, and free a tensor used on several streams only after
  they have synchronised.
- CuPy: CuPy passes no stream to a C allocator, so every block is
  ordered on the null stream and a block freed is reused at once: safe
  while the program's GPU work runs on one stream (the null stream, CuPy's
  default, or one stream of its own). A program that runs work on several
  streams at once should keep CuPy's pool, which keys freed memory by the
  current stream.
"""

import ctypes
import os

__all__ = [
    "library_path",
    "use_in_torch",
    "use_in_cupy",
    "stats",
    "trim",
    "snapshot",
    "hook_times",
    "last_error",
]


class PoolStats(ctypes.Structure):
    """``cuheap_pool_stats_t``."""

    _fields_ = [
        (name, ctypes.c_ulonglong)
        for name in (
            "reserved",
            "in_use",
            "peak_in_use",
            "cached",
            "allocs",
            "frees",
            "same_stream_reuse",
            "cross_stream_reuse",
            "grows",
            "bad_frees",
        )
    ]


def library_path():
    """The path of libcuheap.so (see the module's documentation)."""
    env = os.environ.get("CUHEAP_LIB")
    if env:
        if not os.path.isfile(env):
            raise FileNotFoundError(f"CUHEAP_LIB={env}: no such file")
        return os.path.abspath(env)
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (
        os.path.join(here, "..", "target", "release", "libcuheap.so"),
        os.path.join(here, "libcuheap.so"),
    ):
        if os.path.isfile(p):
            return os.path.abspath(p)
    raise FileNotFoundError(
        "libcuheap.so not found: build it with `cargo build --release -p cuheap-capi` "
        "or set CUHEAP_LIB to its path"
    )


_lib = None


def _library():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path())
        lib.cuheap_last_error.restype = ctypes.c_char_p
        lib.cuheap_device_pool_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(PoolStats)]
        lib.cuheap_device_pool_snapshot.argtypes = [
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_char_p,
        ]
        lib.cuheap_hook_times.argtypes = [ctypes.POINTER(ctypes.c_ulonglong)] * 3
        lib.cuheap_device_pool_trim.argtypes = [
            ctypes.c_int,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
        ]
        _lib = lib
    return _lib


def last_error():
    """The message of the last failed call on this thread ("" if none)."""
    return _library().cuheap_last_error().decode()


def use_in_torch():
    """Makes the process's cuheap pools PyTorch's CUDA allocator. Call it
    before PyTorch allocates on the GPU (PyTorch refuses a change after)."""
    import torch

    alloc = torch.cuda.memory.CUDAPluggableAllocator(
        library_path(), "cuheap_torch_alloc", "cuheap_torch_free"
    )
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


def use_in_cupy():
    """Makes the process's cuheap pools CuPy's allocator."""
    import cupy

    lib = _library()
    cfa = getattr(cupy.cuda, "CFunctionAllocator", None) or cupy.cuda.memory.CFunctionAllocator
    alloc = cfa(
        0,
        ctypes.cast(lib.cuheap_cupy_malloc, ctypes.c_void_p).value,
        ctypes.cast(lib.cuheap_cupy_free, ctypes.c_void_p).value,
        lib,
    )
    cupy.cuda.set_allocator(alloc.malloc)
    return alloc


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed ({rc}): {last_error()}")


def stats(device=0):
    """The pool's statistics on ``device``, as a dict of bytes and counts."""
    s = PoolStats()
    _check(_library().cuheap_device_pool_get_stats(device, ctypes.byref(s)), "cuheap stats")
    return {name: getattr(s, name) for name, _ in PoolStats._fields_}


def trim(device=0, keep=0):
    """Waits for the device, returns cached blocks and unmaps memory no
    block uses, keeping ``keep`` bytes; returns the bytes still mapped."""
    mapped = ctypes.c_size_t()
    _check(_library().cuheap_device_pool_trim(device, keep, ctypes.byref(mapped)), "cuheap trim")
    return mapped.value


def hook_times():
    """Host time spent inside cuheap's PyTorch and CuPy hooks so far, when
    the process runs with ``CUHEAP_HOOK_TIMES`` set (zeros otherwise):
    ``(calls, nanoseconds, longest call in nanoseconds)``."""
    v = [ctypes.c_ulonglong() for _ in range(3)]
    _check(_library().cuheap_hook_times(*[ctypes.byref(x) for x in v]), "cuheap hook times")
    return tuple(x.value for x in v)


def snapshot(device=0, html=None):
    """The pool's memory on ``device`` page by page (mappings, free runs,
    size-class pages, spans and the streams that cache them), as a dict
    read from its JSON; also drawn as an HTML page at the path ``html``
    if given (``cuheap snapshot FILE.json`` draws a saved one)."""
    import json

    lib = _library()
    path = html.encode() if html is not None else None
    needed = ctypes.c_size_t()
    _check(lib.cuheap_device_pool_snapshot(device, None, 0, ctypes.byref(needed), None), "cuheap snapshot")
    for _ in range(4):  # the pool may grow between the size query and the copy
        buf = ctypes.create_string_buffer(needed.value + 4096)
        rc = lib.cuheap_device_pool_snapshot(device, buf, len(buf), ctypes.byref(needed), path)
        if rc == 0:
            return json.loads(buf.value.decode())
        if needed.value < len(buf):
            break  # not a short buffer: report it
    _check(rc, "cuheap snapshot")
