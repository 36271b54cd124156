"""``torch.recdev``: the device module, mirroring ``torch.cuda``'s basics.

recdev has one device, ``recdev:0``, and runs synchronously: a kernel's work
is done when it returns. Its streams and events (``Stream``, ``Event``,
``current_stream``, ``stream``) are real handles over one timeline, where the
only work left after a call returns is the async store operations
(``ops.emb_prefetch``, ``emb_write_async``): an event completes with the ones
issued before it, and synchronizing waits for them (csrc/device/guard.cpp).
"""

from __future__ import annotations

import torch

from . import _C
from .stores import server_stats, store_info


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    """recdev holds no state a fork can break (torch.random asks)."""
    return False


def _lazy_init() -> None:
    """Nothing to initialize: the device is ready once the extension loads."""


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def _index_of(device) -> int:
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "recdev":
        raise ValueError(f"expected a recdev device, got {device}")
    return 0 if device.index is None else device.index


def set_device(device) -> None:
    index = _index_of(device)
    if index != 0:
        raise ValueError(f"recdev has one device, recdev:0; got index {index}")


_check_device = set_device  # with one device, setting it only checks it


class device:
    """Context manager that makes a recdev device current, as torch.cuda.device.

    recdev has one device, so it only checks the argument."""

    def __init__(self, device):
        self.idx = -1 if device is None else _index_of(device)
        if self.idx not in (-1, 0):
            raise ValueError(f"recdev has one device, recdev:0; got index {self.idx}")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False


def synchronize(device=None) -> None:
    """Waits for all work on the device: the async store operations issued so far (kernels complete
    before they return), and the remote store's updates that backward did not wait for
    (``connect(..., overlap_updates=True)``), raising one the shards refused."""
    set_device(0 if device is None else device)
    _C._wait_for_async_ops()
    _C._wait_for_store_answers()


class Stream(torch.Stream):
    """A recdev stream, as ``torch.cuda.Stream``: ``Stream()`` is a new one (``priority`` is accepted
    and has no effect); ``query``, ``synchronize``, ``wait_event``, ``wait_stream``, ``record_event``
    and ``with stream:`` are torch.Stream's. Every stream is ordered after everything issued before
    it, so waiting on one waits for the async store operations issued before."""

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # an existing stream: stream_id, device_index, device_type
            return super().__new__(cls, priority=priority, **kwargs)
        _check_device(0 if device is None else device)
        return super().__new__(cls, torch.device("recdev", 0), priority=priority)

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event


class Event(torch.Event):
    """A recdev event, as ``torch.cuda.Event``: ``record``, ``wait``, ``query``, ``synchronize``. It
    completes with the async store operations issued before it was recorded. ``elapsed_time`` is not
    supported (recdev keeps no device clock)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return super().__new__(cls, torch.device("recdev", 0), enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)


def _as_recdev_stream(stream: torch.Stream) -> Stream:
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)


def current_stream(device=None) -> Stream:
    """This thread's current stream (the default stream until ``set_stream`` or ``stream``)."""
    _check_device(0 if device is None else device)
    return _as_recdev_stream(torch.accelerator.current_stream(torch.device("recdev", 0)))


def default_stream(device=None) -> Stream:
    current = current_stream(device)  # for torch's number of the device type
    return Stream(stream_id=0, device_index=0, device_type=current.device_type)


def set_stream(stream: torch.Stream | None) -> None:
    """Makes ``stream`` this thread's current stream (no-op for None)."""
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """``with torch.recdev.stream(s):`` makes ``s`` current inside and restores the previous stream
    after (as ``torch.cuda.StreamContext``; None changes nothing)."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.previous = None

    def __enter__(self):
        if self.stream is not None:
            self.previous = current_stream()
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc_info):
        if self.stream is not None:
            set_stream(self.previous)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def empty_cache() -> None:
    """Gives back the freed memory recdev keeps for reuse (see memory_cached)."""
    _C._empty_cache()


def memory_cached() -> int:
    """Bytes of freed memory kept for reuse: large host blocks (RECDEV_HOST_CACHE_BYTES caps them)
    and the embedded store's empty 2 MiB regions (RECDEV_STORE_CACHE_BYTES caps them)."""
    return _C._memory_cached()


# Memory, as torch.cuda reports it. The figures are this process's: host storage (recdev tensors
# that are not tables) and the tables of the embedded store, counted when they are allocated and
# freed (docs/device.md, "Memory", maps every stat name). Tables on recdev-server shards are the
# shards' memory: shard_memory_stats() asks them.


def memory_stats(device=None) -> dict:
    """torch.accelerator.memory_stats() (PyTorch's names: ``allocated_bytes.all.current``, ...), plus
    the same figures for host storage and tables apart: ``host_allocated_bytes.*``,
    ``table_allocated_bytes.*``, ``host_reserved_bytes.*``, ``table_reserved_bytes.*`` (each
    ``current``, ``peak``, ``allocated``, ``freed``)."""
    stats = torch.accelerator.memory_stats(_index_of(0 if device is None else device))
    return dict(sorted({**stats, **_C._memory_split()}.items()))


def memory_allocated(device=None) -> int:
    """Bytes in use: host storage plus the embedded store's tables."""
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """The peak of memory_allocated() since the start or reset_peak_memory_stats()."""
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    """memory_allocated() plus what is kept for reuse (memory_cached(), and the store's regions'
    unused room)."""
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index_of(0 if device is None else device))


def reset_accumulated_memory_stats(device=None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index_of(0 if device is None else device))


def mem_get_info(device=None) -> tuple:
    """(free, total) bytes of the host's memory, which host storage and tables share."""
    return torch.accelerator.get_memory_info(_index_of(0 if device is None else device))


def shard_memory_stats(*, token: str = "", timeout: float = 10.0) -> list:
    """For a remote store, each shard's memory, in shard order: ``address``, ``bytes`` (its tables),
    ``rows`` and ``max_memory`` (its ``--max-memory``, 0 for none), from the shards' STATS; ``token``
    is the servers' ``--token-file`` token. Empty for the embedded store, whose tables
    memory_stats() counts."""
    shards = []
    for url in store_info()["servers"]:
        address = url.removeprefix("tcp://")
        stats = server_stats(address, token=token, timeout=timeout)
        shards.append({"address": address, "bytes": stats["bytes"], "rows": stats["rows"],
                       "max_memory": stats["max_memory"]})
    return shards


def get_amp_supported_dtype() -> list:
    """The dtypes torch.autocast("recdev", dtype=...) takes: float16 and bfloat16, with CPU
    autocast's ops and cast policies (docs/device.md, "Autocast")."""
    return [torch.float16, torch.bfloat16]


def _generator(device=0) -> torch.Generator:
    return _C._default_generator(_index_of(device))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    seed()


def initial_seed() -> int:
    return _generator().initial_seed()


def get_rng_state(device="recdev") -> torch.Tensor:
    """The generator state: 16 bytes, (seed, offset) as two little-endian uint64."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="recdev") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state()]


def set_rng_state_all(new_states) -> None:
    (state,) = new_states
    set_rng_state(state)


def _legacy_storage_class(name: str, dtype: torch.dtype) -> type:
    """``torch.recdev.<Name>Storage``, as ``torch.cuda.<Name>Storage``: what ``tensor.storage_type()``
    and ``TypedStorage.type()`` return for a recdev tensor. torch.storage looks the class up by name on
    the device module and takes its device from the last part of ``__module__``, which must therefore
    be ``torch.recdev``; without it both answer None / ``torch.storage.TypedStorage``."""

    def public_dtype(cls):
        torch.storage._warn_typed_storage_removal()
        return dtype

    return type(
        name,
        (torch.storage._LegacyStorage,),
        {
            "__module__": "torch.recdev",
            "__qualname__": name,
            "dtype": torch._utils.classproperty(public_dtype),
            "_dtype": torch._utils.classproperty(lambda cls: dtype),
        },
    )


# recdev has no quantized tensors, so no quantized storage classes (nor does torch.cuda).
_QUANTIZED = {torch.qint8, torch.qint32, torch.quint8, torch.quint4x2, torch.quint2x4}
for _dtype, _name in torch.storage._dtype_to_storage_type_map().items():
    if _dtype not in _QUANTIZED:
        globals()[_name] = _legacy_storage_class(_name, _dtype)
del _dtype, _name


def __getattr__(name):
    if name == "default_generators":
        return (_generator(),)
    raise AttributeError(f"module 'torch.recdev' has no attribute '{name}'")
