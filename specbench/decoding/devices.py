"""Devices: pick device and dtype, read clocks honestly, track peak memory per request."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specbench.core import gpus
from specbench.core.errors import OneLineError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class DeviceError(OneLineError, ValueError):
    """The requested device is not on this machine."""


def resolve_device(name: str = "auto", *, driver_gpus: int | None = None) -> torch.device:
    """`auto` takes the first CUDA device when there is one, else the CPU — but not silently where the NVIDIA driver
    shows GPUs that this torch cannot use (a wheel built for a newer CUDA than the driver runs): that is an error.
    `driver_gpus`: how many GPUs the driver shows (default: NVML's answer)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if driver_gpus is None:
            driver_gpus = len(gpus.machine_gpus(None))
        if driver_gpus:
            raise DeviceError(_unusable_gpus(driver_gpus))
        return torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device '{name}' requested but CUDA is not available; use --device cpu or device = \"auto\"")
    return device


def _unusable_gpus(count: int) -> str:
    found = gpus.machine_gpus(None)
    driver = found[0].cuda_driver_version if found else None
    return (f"the NVIDIA driver shows {count} GPU(s), but this torch ({torch.__version__}, built for CUDA "
            f"{torch.version.cuda or 'none: a CPU build'}) cannot use them"
            + (f" (the driver runs CUDA up to {driver})" if driver else "")
            + "; install a torch built for the driver's CUDA into specbench's environment, or set "
              "device = \"cpu\" to run on the CPU on purpose")


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on GPUs that support it, float16 on older GPUs, float32 on the CPU."""
    if name != "auto":
        return _DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def gpu_uuid(device: torch.device) -> str | None:
    """NVML's UUID ("GPU-...") of a CUDA device: what tells it apart whatever CUDA_VISIBLE_DEVICES renumbered."""
    if device.type != "cuda":
        return None
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid is None:
        return None
    text = str(uuid)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model_name()


def _cpu_model_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Seconds since construction, read only after the device has finished its queued work."""

    def __init__(self, device: torch.device):
        self.device = device
        synchronize(device)
        self.start = time.perf_counter()

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter() - self.start


class PeakMemory:
    """Peak memory growth over a region: CUDA `max_memory_allocated` after a reset; on the CPU the
    process's peak RSS (VmHWM, reset through /proc/self/clear_refs) over the RSS at the start."""

    def __init__(self, device: torch.device):
        self.device = device
        self._base: int | None = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            _reset_peak_rss()
            rss_kb = _status_kb("VmRSS")
            self._base = None if rss_kb is None else rss_kb * 1024

    def growth_bytes(self) -> int | None:
        """None where the platform cannot tell (a CPU without Linux's /proc)."""
        if self.device.type == "cuda":
            synchronize(self.device)
            return max(0, torch.cuda.max_memory_allocated(self.device) - self._base)
        peak_kb = _status_kb("VmHWM")
        if peak_kb is None or self._base is None:
            return None
        return max(0, peak_kb * 1024 - self._base)


def resident_bytes(device: torch.device) -> int | None:
    """Memory held now: CUDA `memory_allocated`, else the process's RSS (None where /proc cannot tell)."""
    if device.type == "cuda":
        synchronize(device)
        return torch.cuda.memory_allocated(device)
    rss_kb = _status_kb("VmRSS")
    return None if rss_kb is None else rss_kb * 1024


def available_bytes(device: torch.device) -> int | None:
    """Memory a process can still take: free CUDA memory, else the host's MemAvailable (None where unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    available_kb = _status_kb("MemAvailable", Path("/proc/meminfo"))
    return None if available_kb is None else available_kb * 1024


def _reset_peak_rss() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux, or not permitted: VmHWM then holds the lifetime peak
        pass


def _status_kb(key: str, path: Path = Path("/proc/self/status")) -> int | None:
    """A "Key:  N kB" line of a /proc file (the process's status by default), in kB."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None
