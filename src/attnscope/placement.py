"""Where a model runs and in which number format: validate --device and --dtype (torch imported lazily).

CPU float32 is the default and the path every check is held to 1e-5 on; the tolerance of the other
formats is `attnscope.records.check_report.tolerance_for` (docs/models.md says why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from attnscope.errors import AttnscopeError
from attnscope.numbers import is_count

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
DEVICES = ("cpu", "cuda", "mps")  # cuda may name an index: cuda:1


def validate_dtype_name(dtype: str) -> str:
    """One of DTYPES, or AttnscopeError."""
    if dtype not in DTYPES:
        raise AttnscopeError(f"dtype={dtype!r} is not supported: use one of {', '.join(DTYPES)}",
                             parameter="dtype")
    return dtype


def validate_device_name(device: str) -> str:
    """cpu, mps, cuda or cuda:N by name (whether it is present is resolve_device's question)."""
    kind, _, index = device.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not is_count(index))):
        raise AttnscopeError(f"device={device!r} is not supported: use cpu, cuda, cuda:N or mps", parameter="device")
    return device


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """The torch dtype for a name (None: float32)."""
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
        validate_dtype_name(name)
        return dtype
    return getattr(torch, validate_dtype_name(str(dtype)))  # type: ignore[no-any-return]


def resolve_device(device: str | torch.device | None) -> torch.device:
    """A device that is present here (None: cpu), or AttnscopeError naming what is missing."""
    import torch

    dev = torch.device(validate_device_name(str(device)) if device is not None else "cpu")
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise AttnscopeError(f"device={str(dev)!r} is not available: this torch sees no CUDA GPU "
                                 "(use device='cpu')", parameter="device")
        if (dev.index or 0) >= count:
            raise AttnscopeError(f"device={str(dev)!r} is not available: this machine has {count} CUDA "
                                 f"device(s), cuda:0 to cuda:{count - 1}", parameter="device")
        dev = torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise AttnscopeError("device='mps' is not available: this torch has no Apple GPU (use device='cpu')",
                             parameter="device")
    return dev


def dtype_name(dtype: torch.dtype) -> str:
    """float32, bfloat16, float16: the name used in traces, JSON and the CLI."""
    return str(dtype).removeprefix("torch.")


def on_host(value: Any) -> Any:
    """Tensors (also in lists, dicts and dataclasses such as AttentionParams) as float32 on the CPU.

    A no-op (the same objects) for float32 on the CPU; exact for bfloat16 and float16. So the check
    recomputes in float32 from the very inputs and weights the model used and measures the model's
    own rounding (report.tolerance_for states how much is allowed per dtype), and numpy can hold them.
    """
    import torch

    if isinstance(value, torch.Tensor):
        return value.to("cpu", torch.float32) if value.is_floating_point() else value.cpu()
    if isinstance(value, list):
        return [on_host(v) for v in value]
    if isinstance(value, dict):
        return {k: on_host(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: on_host(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return dataclasses.replace(value, **fields)
    return value


def idle_cores() -> int:
    """The CPUs not busy now: the count this process may use minus the 1-minute load average (at least 1).

    torch starts one thread per core; on a shared machine those threads wait on each other (a 20-token
    generation took 42 s at load 4 on 2 cores with torch's 2 threads, 9.7 s with 1), so the CLI asks for no more
    threads than there are idle cores."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        busy = os.getloadavg()[0]
    except OSError:  # no load average on this system
        return cores
    return max(1, min(cores, round(cores - busy)))


@contextlib.contextmanager
def using_threads(threads: int | None) -> Iterator[int]:
    """torch's intra-op threads inside the block: `threads`, or idle_cores() for None; 0 keeps torch's own choice.
    Yields the number asked for (0: torch's). Before torch is imported, OMP_NUM_THREADS says it (importing torch
    for a command that needs none would cost a second); afterwards torch.set_num_threads, restored at the end."""
    if threads is None:
        threads = idle_cores()
    if threads < 0:
        raise AttnscopeError(f"threads {threads} is out of range: use 1 or more (0 keeps torch's default)",
                             parameter="threads")
    torch = sys.modules.get("torch")
    before = None if torch is None else torch.get_num_threads()
    if threads > 0:
        if torch is None:
            os.environ["OMP_NUM_THREADS"] = str(threads)
        else:
            torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        if before is not None:
            torch.set_num_threads(before)  # type: ignore[union-attr]
