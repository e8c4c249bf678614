"""The machine's NVIDIA GPUs as NVML reports them (nvidia-ml-py, the bindings NVIDIA maintains; nvidia-smi's text is
not kept stable): which exist, which a process may use (CUDA_VISIBLE_DEVICES, by index or UUID), what they are (for
the manifest), and over a measured window what the run's own processes hold on them, how busy they were, the energy
they used and whether anyone else was on them. Torch-free: the server backend measures an engine from outside it.

NVML's answers come through one small reader (`Nvml`); everything that decides from them takes plain facts (`Gpu`,
`Sample`), so the logic is tested with facts supplied where no GPU is.

Which of a GPU's processes are the engine's: NVML numbers them in the host's pid namespace, so in a container (docker,
Kubernetes) on many drivers they are not the numbers the run sees. A launch is therefore judged by what changed on its
GPUs (`Claim`): read before the launch and once the engine answers, the engine's processes are its own pids where NVML
lists them, else the processes that appeared with the launch; where NVML lists none, its memory is the GPUs' used
memory less what they held before the launch. How it was found is recorded per point and per launch.

GPU indices are NVML's (PCI bus order, as nvidia-smi numbers them); specbench launches engines and workers with
CUDA_DEVICE_ORDER=PCI_BUS_ID so that CUDA numbers them the same way."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specbench.core.errors import OneLineError

PCI_ORDER = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}  # CUDA's default order (fastest first) differs from NVML's


@dataclass(frozen=True)
class Gpu:
    """One GPU, for the manifest and for telling GPUs apart."""

    index: int
    uuid: str
    name: str
    memory_total_mb: float
    driver_version: str | None = None
    cuda_driver_version: str | None = None  # the newest CUDA the driver runs, e.g. "12.4"
    sm_clock_max_mhz: int | None = None
    memory_clock_max_mhz: int | None = None
    power_limit_w: float | None = None  # the enforced limit
    mig_mode: str | None = None  # "enabled", "disabled", or None where the GPU has no MIG


@dataclass(frozen=True)
class Sample:
    """One reading of one GPU."""

    uuid: str
    utilization_pct: float | None  # share of the sample period a kernel ran
    memory_used_mb: float | None  # by everyone
    energy_mj: float | None  # since the driver loaded (Volta and later; None before)
    process_memory_mb: dict[int, float | None] = field(default_factory=dict)  # pid -> what it holds (None: hidden)


@dataclass(frozen=True)
class Claim:
    """A launched engine's processes on its GPUs, as NVML numbers them, and what the GPUs held before it launched."""

    match: str | None  # "pid": NVML lists the engine's own pids; "launch": the processes that appeared with the
    #                    launch (NVML's pids are another namespace's, as in a container); None: NVML lists none
    pids: frozenset[int]  # NVML's numbers for the engine's processes ("launch"; "pid": those seen at readiness)
    used_before_mb: dict[str, float | None] = field(default_factory=dict)  # uuid -> used memory before the launch

    def engine_pids(self, own: set[int]) -> set[int]:
        """NVML's numbers for the engine's processes, given the run's own process tree now."""
        return set(self.pids) if self.match == "launch" else own | self.pids

    def as_manifest(self) -> dict[str, Any]:
        return {"match": self.match, "pids": sorted(self.pids), "used_before_mb": dict(self.used_before_mb)}


def claim(before: Sequence[Sample], after: Sequence[Sample], *, own: set[int]) -> Claim:
    """How to find a launch's processes, from its GPUs read before the launch and once it answers: its own pids where
    NVML lists any of them; else the processes listed now that were not before."""
    listed_before = {pid for sample in before for pid in sample.process_memory_mb}
    listed_after = {pid for sample in after for pid in sample.process_memory_mb}
    used_before = {sample.uuid: sample.memory_used_mb for sample in before}
    if listed_after & own:
        return Claim("pid", frozenset(listed_after & own), used_before)
    appeared = listed_after - listed_before
    return Claim("launch" if appeared else None, frozenset(appeared), used_before)


@dataclass(frozen=True)
class GpuWindow:
    """What a measured window shows on its GPUs."""

    gpus: int  # how many were watched
    peak_memory_mb: float | None  # the run's own processes together, at the sample where they held most
    memory_source: str | None  # "processes" (NVML per process), "device" (the GPUs' used memory, everyone's) or
    #                            "device-since-launch" (the GPUs' used memory less what they held before the launch)
    utilization_pct: float | None  # mean over samples and GPUs
    energy_j: float | None  # all watched GPUs, first sample to last
    duration_s: float
    samples: int
    other_processes: int  # the most processes not the run's own seen on these GPUs at once
    process_match: str | None = None  # how the engine's processes were told apart (Claim.match); None: no claim

    def as_columns(self) -> dict[str, Any]:
        return {"gpu_count": self.gpus, "gpu_peak_memory_mb": self.peak_memory_mb,
                "gpu_memory_source": self.memory_source, "gpu_process_match": self.process_match,
                "gpu_utilization_pct": self.utilization_pct,
                "gpu_energy_j": self.energy_j, "gpu_window_s": self.duration_s, "gpu_samples": self.samples}


# --- which GPUs a process may use -------------------------------------------------------------------------------

def visible(gpus: Sequence[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs CUDA shows a process started with `cuda_visible_devices`, in CUDA's order: every GPU when unset; the
    listed ones by index or UUID (a unique prefix, as CUDA takes it), up to the first entry that names none (CUDA
    ignores the rest). MIG instances ("MIG-...") are not GPUs NVML attributes processes to: they end the list."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for entry in (part.strip() for part in cuda_visible_devices.split(",")):
        match = None
        if entry.isdigit():
            match = next((gpu for gpu in gpus if gpu.index == int(entry)), None)
        elif entry.startswith("GPU-"):
            found = [gpu for gpu in gpus if gpu.uuid.startswith(entry)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


def groups(gpus: Sequence[Gpu], *, size: int, count: int) -> list[tuple[Gpu, ...]]:
    """`count` disjoint groups of `size` GPUs each, in order (worker i takes group i); GpuError when there are not
    enough."""
    if size < 1 or count < 1:
        raise GpuError(f"needs at least one GPU per group and one group (got {size} x {count})")
    if size * count > len(gpus):
        raise GpuError(f"{count} worker(s) x {size} GPU(s) each need {size * count} GPUs; {len(gpus)} "
                       f"{'is' if len(gpus) == 1 else 'are'} visible")
    return [tuple(gpus[i * size:(i + 1) * size]) for i in range(count)]


def device_list(group: Sequence[Gpu]) -> str:
    """CUDA_VISIBLE_DEVICES for a group (indices, meant in PCI order: pass PCI_ORDER beside it)."""
    return ",".join(str(gpu.index) for gpu in group)


class GpuError(OneLineError, ValueError):
    """GPUs asked for that this machine does not have; one line."""


# --- what a window shows -----------------------------------------------------------------------------------------

def summarize(readings: Sequence[tuple[float, Sequence[Sample]]], *, own_pids: set[int],
              claim: Claim | None = None) -> GpuWindow:
    """A window from its readings, each (monotonic time, one Sample per watched GPU). The engine's memory is its
    processes' where NVML lists them with their memory, else the GPUs' used memory (less what they held before the
    launch, given a claim); never the sum over no process."""
    if not readings:
        return GpuWindow(0, None, None, None, None, 0.0, 0, 0)
    watched = len(readings[0][1])
    engine = claim.engine_pids(own_pids) if claim is not None else own_pids
    listed = [memory for _, samples in readings for s in samples
              for pid, memory in s.process_memory_mb.items() if pid in engine]
    per_process = bool(listed) and all(memory is not None for memory in listed)
    before = claim.used_before_mb if claim is not None else {}
    since_launch = bool(before) and all(value is not None for value in before.values())
    held = []
    for _, samples in readings:
        if per_process:
            held.append(sum(memory or 0.0 for s in samples for pid, memory in s.process_memory_mb.items()
                            if pid in engine))
        elif all(s.memory_used_mb is not None for s in samples):
            held.append(sum(max(0.0, s.memory_used_mb - (before.get(s.uuid) or 0.0) if since_launch else
                                s.memory_used_mb) for s in samples))
    source = "processes" if per_process else ("device-since-launch" if since_launch else "device")
    busy = [s.utilization_pct for _, samples in readings for s in samples if s.utilization_pct is not None]
    first, last = readings[0][1], readings[-1][1]
    energy = None
    if all(s.energy_mj is not None for s in (*first, *last)):
        energy = sum(b.energy_mj - a.energy_mj for a, b in zip(first, last)) / 1e3
    others = max(len({pid for s in samples for pid in s.process_memory_mb} - engine - own_pids)
                 for _, samples in readings)
    return GpuWindow(gpus=watched, peak_memory_mb=max(held) if held else None, memory_source=source if held else None,
                     utilization_pct=sum(busy) / len(busy) if busy else None, energy_j=energy,
                     duration_s=readings[-1][0] - readings[0][0], samples=len(readings), other_processes=others,
                     process_match=claim.match if claim is not None else None)


class GpuMonitor:
    """Around a measured window: `with GpuMonitor(nvml, uuids, own_pids) as monitor: ...; monitor.window`. Reads the
    GPUs at the start, every `interval_s` from a thread, and at the end (the energy counter is read at both ends)."""

    def __init__(self, nvml: "Nvml", uuids: Sequence[str], own_pids: Callable[[], Sequence[int]], *,
                 claim: Claim | None = None, interval_s: float = 0.25):
        self.nvml, self.uuids, self.own_pids, self.interval_s = nvml, tuple(uuids), own_pids, interval_s
        self.claim = claim
        self.readings: list[tuple[float, list[Sample]]] = []
        self._own: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.window: GpuWindow | None = None

    def _read(self) -> None:
        self._own.update(self.own_pids())
        self.readings.append((time.monotonic(), self.nvml.sample(self.uuids)))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def __enter__(self) -> "GpuMonitor":
        self._read()
        self._thread = threading.Thread(target=self._loop, name="specbench-gpu-monitor", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._read()
        self.window = summarize(self.readings, own_pids=self._own, claim=self.claim)


@contextlib.contextmanager
def watched(uuids: Sequence[str], own_pids: Callable[[], Sequence[int]], *, claim: Claim | None = None,
            nvml: "Nvml | None" = None):
    """A GpuMonitor around the block where there are GPUs to watch and NVML answers; else None (nothing measured)."""
    nvml = nvml if nvml is not None else (open_nvml() if uuids else None)
    if not uuids or nvml is None:
        yield None
        return
    with GpuMonitor(nvml, uuids, own_pids, claim=claim) as monitor:
        yield monitor


def read(uuids: Sequence[str], nvml: "Nvml | None" = None) -> list[Sample] | None:
    """One reading of the GPUs `uuids` (a claim's before or after); None where there are none or NVML does not answer."""
    nvml = nvml if nvml is not None else (open_nvml() if uuids else None)
    return nvml.sample(uuids) if uuids and nvml is not None else None


def window_columns(monitor: GpuMonitor | None) -> dict[str, Any]:
    """A watched window's figures as point columns ({} where nothing was watched)."""
    return monitor.window.as_columns() if monitor is not None and monitor.window is not None else {}


# --- NVML ---------------------------------------------------------------------------------------------------------

class Nvml:
    """The few NVML calls specbench makes. `open_nvml()` gives one, or None where there is no NVIDIA driver."""

    def __init__(self, module: Any):
        self._nv = module

    def _handles(self) -> list[Any]:
        return [self._nv.nvmlDeviceGetHandleByIndex(i) for i in range(self._nv.nvmlDeviceGetCount())]

    def _try(self, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self._nv.NVMLError:  # not supported on this GPU or driver
            return None

    def gpus(self) -> list[Gpu]:
        nv = self._nv
        driver = self._try(nv.nvmlSystemGetDriverVersion)
        cuda = self._try(nv.nvmlSystemGetCudaDriverVersion)
        out = []
        for index, handle in enumerate(self._handles()):
            mig = self._try(lambda: nv.nvmlDeviceGetMigMode(handle))
            power = self._try(lambda: nv.nvmlDeviceGetEnforcedPowerLimit(handle))
            out.append(Gpu(
                index=index, uuid=_text(nv.nvmlDeviceGetUUID(handle)), name=_text(nv.nvmlDeviceGetName(handle)),
                memory_total_mb=nv.nvmlDeviceGetMemoryInfo(handle).total / 2**20, driver_version=_text(driver),
                cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
                sm_clock_max_mhz=self._try(lambda: nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_SM)),
                memory_clock_max_mhz=self._try(lambda: nv.nvmlDeviceGetMaxClockInfo(handle, nv.NVML_CLOCK_MEM)),
                power_limit_w=power / 1e3 if power is not None else None,
                mig_mode=None if mig is None else ("enabled" if mig[0] else "disabled")))
        return out

    def sample(self, uuids: Sequence[str]) -> list[Sample]:
        nv = self._nv
        out = []
        for uuid in uuids:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            rates = self._try(lambda: nv.nvmlDeviceGetUtilizationRates(handle))
            memory = self._try(lambda: nv.nvmlDeviceGetMemoryInfo(handle))
            processes = self._try(lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle)) or []
            out.append(Sample(
                uuid=uuid, utilization_pct=float(rates.gpu) if rates is not None else None,
                memory_used_mb=memory.used / 2**20 if memory is not None else None,
                energy_mj=self._try(lambda: float(nv.nvmlDeviceGetTotalEnergyConsumption(handle))),
                # usedGpuMemory is None where the driver hides it (no pid namespace access, Windows WDDM)
                process_memory_mb={p.pid: p.usedGpuMemory / 2**20 if p.usedGpuMemory is not None else None
                                   for p in processes}))
        return out


_NVML: list[Nvml | None] = []  # opened once per process


def open_nvml() -> Nvml | None:
    """NVML, initialised once; None when nvidia-ml-py is missing or no NVIDIA driver answers (a CPU machine)."""
    if not _NVML:
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML.append(Nvml(pynvml))
        except Exception:  # noqa: BLE001 - ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
            _NVML.append(None)
    return _NVML[0]


def machine_gpus(cuda_visible_devices: str | None, nvml: Nvml | None = None) -> list[Gpu]:
    """The GPUs a process started with `cuda_visible_devices` sees; none on a machine without an NVIDIA driver."""
    nvml = nvml if nvml is not None else open_nvml()
    return visible(nvml.gpus(), cuda_visible_devices) if nvml is not None else []


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value
