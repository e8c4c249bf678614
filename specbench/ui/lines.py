"""Progress as plain lines, for a console that is not a terminal (a pipe, a file, a Kubernetes or Slurm job log,
TERM=dumb), where rich's progress bars show nothing until the end.

One timestamped line at the sweep's start, when each point starts and when it finishes (its requests, tokens/s,
speedup with its interval, acceptance, status), and a heartbeat while a point runs: a line whenever nothing was
printed for `heartbeat_s` seconds, from a thread of its own, so it comes even while no request completes (a launch,
one request of minutes on a big model). Every line is written at once (rich flushes after each print). Modelled on
what `vllm bench serve` and GuideLLM print: labelled figures with their units, the successful and failed requests,
a start time per run; no carriage-return bars in a log."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rich.console import Console

from specbench.core.results import PointSpec, plain

HEARTBEAT_S = 30.0  # at most this long without a line while a point runs ("at least once a minute", with margin)


class ProgressStyle(str, Enum):
    """How `specbench run` shows progress: `auto` (bars in a terminal, lines elsewhere), `bars`, `lines`."""

    auto = "auto"
    bars = "bars"
    lines = "lines"


def wants_lines(console: Console, style: ProgressStyle = ProgressStyle.auto) -> bool:
    """Plain lines where asked, or in `auto` where the console is not a terminal (or a dumb one)."""
    if style != ProgressStyle.auto:
        return style == ProgressStyle.lines
    return not console.is_terminal or console.is_dumb_terminal


def wall_stamp() -> str:
    """The local time as Python's logging writes it by default, without the milliseconds."""
    return time.strftime("%Y-%m-%d %H:%M:%S")


def duration(seconds: float) -> str:
    """H:MM:SS, as rich's and tqdm's elapsed and remaining columns."""
    whole = max(0, int(round(seconds)))
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


class Heartbeat:
    """Calls `beat` from a daemon thread whenever `touch` has not been called for `interval_s` seconds."""

    def __init__(self, interval_s: float, beat: Callable[[], None], *, clock: Callable[[], float] = time.monotonic):
        self.interval_s, self.beat, self.clock = interval_s, beat, clock
        self._last = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="specbench-heartbeat", daemon=True)

    def touch(self) -> None:
        """A line was printed now."""
        self._last = self.clock()

    def start(self) -> None:
        self.touch()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(max(0.0, self.interval_s - (self.clock() - self._last))):
            if self.clock() - self._last >= self.interval_s:
                self.beat()
                self.touch()  # whether or not it printed: the next look is an interval later


class PlainLines:
    """Timestamped lines on `console`, one write each, never wrapped, no markup; a heartbeat while `beat` has
    something to say (`beat_text` returns None when it has not)."""

    def __init__(self, console: Console, *, heartbeat_s: float = HEARTBEAT_S, clock: Callable[[], float] = time.monotonic,
                 stamp: Callable[[], str] = wall_stamp):
        self.console, self.clock, self.stamp = console, clock, stamp
        self.lock = threading.RLock()  # the heartbeat's thread and the callers' (a server's requests end in threads)
        self.heartbeat = Heartbeat(heartbeat_s, self._beat, clock=clock)

    def __enter__(self):
        self.heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.heartbeat.stop()

    def say(self, text: str) -> None:
        with self.lock:
            self.console.print(f"{self.stamp()} {text}", markup=False, highlight=False, emoji=False, soft_wrap=True)
            self.heartbeat.touch()

    def message(self, text: str) -> None:
        self.say(text)

    def beat_text(self) -> str | None:
        return None

    def _beat(self) -> None:
        with self.lock:
            text = self.beat_text()
            if text is not None:
                self.say(text)


class SweepLines(PlainLines):
    """`specbench run` in a log (implements SweepObserver)."""

    def __init__(self, console: Console, **options: Any):
        super().__init__(console, **options)
        self._total = 0
        self._finished = 0  # points done: resumed, and finished in this run
        self._known_ok: set[str] = set()  # point ids recorded ok (resumed, or finished ok in this run)
        self._known_failed: set[str] = set()
        self._to_run: set[str] = set()
        self._started = 0  # points started: resumed, and started in this run (numbers them)
        self._open: dict[str, _OpenPoint] = {}  # by point id: one per worker of `--workers N`

    def sweep_started(self, points: list[PointSpec], to_run: list[PointSpec]) -> None:
        running = {spec.point_id for spec in to_run}
        with self.lock:
            self._total = len(points)
            self._finished = self._started = len(points) - len(to_run)
            self._to_run = running
            self._known_ok = {spec.point_id for spec in points} - running
        self.say(f"sweep: {len(points)} points, {len(to_run)} to run, {len(points) - len(to_run)} resumed")

    def point_started(self, spec: PointSpec, n_requests: int) -> None:
        with self.lock:
            numbered = spec.point_id in self._to_run and spec.point_id not in self._known_ok | self._known_failed
            self._started += numbered
            # a capacity probe is started, never finished (its search says the outcome), and runs in one process
            # (no --workers): the next point to start ends it
            self._open = {key: point for key, point in self._open.items() if not point.label.startswith("probe ")}
            label = f"point {self._started}/{self._total} {spec.point_id}" if numbered else f"probe {spec.point_id}"
            self._open[spec.point_id] = _OpenPoint(spec.point_id, label, n_requests, self.clock())
            self.say(f"{label}: started, {n_requests} request{'' if n_requests == 1 else 's'}")

    def request_done(self, spec: PointSpec) -> None:
        with self.lock:
            if spec.point_id in self._open:
                self._open[spec.point_id].done += 1

    def point_finished(self, spec: PointSpec, row: dict[str, Any]) -> None:
        with self.lock:
            point = self._open.pop(spec.point_id, None) or \
                _OpenPoint(spec.point_id, f"point {self._finished + 1}/{self._total} {spec.point_id}", 0, self.clock())
            self._finished += 1
            ok = row.get("status") == "ok"
            (self._known_ok if ok else self._known_failed).add(spec.point_id)
            baseline = "ok" if spec.baseline_id in self._known_ok else \
                "failed" if spec.baseline_id in self._known_failed else "pending"
            self.say(point_line(spec, {key: plain(value) for key, value in row.items()}, label=point.label,
                                done=point.done, total=point.total, elapsed_s=self.clock() - point.started,
                                baseline=baseline))

    def beat_text(self) -> str | None:
        """The open points (several with `--workers N`), in the order they started; None with none open."""
        now = self.clock()
        return "; ".join(heartbeat_line(point.label, done=point.done, total=point.total, elapsed_s=now - point.started)
                         for point in self._open.values()) or None


@dataclass
class _OpenPoint:
    """The point running now, as the observer counts it."""

    point_id: str
    label: str
    total: int  # requests it sends
    started: float  # the clock when it started
    done: int = 0  # requests answered so far


def heartbeat_line(label: str, *, done: int, total: int, elapsed_s: float) -> str:
    """A running point: its requests so far, the time since it started, and the time left at the pace so far."""
    eta = duration(elapsed_s / done * (total - done)) if 0 < done <= total else "-"
    return f"{label}: running, {done}/{total} requests, elapsed {duration(elapsed_s)}, eta {eta}"


def point_line(spec: PointSpec, row: dict[str, Any], *, label: str, done: int, total: int, elapsed_s: float,
               baseline: str = "ok") -> str:
    """A finished point in one line: `row` is its row of points.parquet (plain values); `baseline` is whether its
    baseline is recorded (ok, failed, pending), for a speedup the row does not have."""
    took = f"in {duration(elapsed_s)}"
    if row.get("status") != "ok":
        return f"{label}: failed after {done}/{total} requests, {took}: {row.get('error')}"
    failed = row.get("failed_requests") or 0
    parts = [f"{done}/{total} requests ({failed} failed)", f"{_number(row.get('tokens_per_s'), '.1f')} tok/s"]
    if spec.method != "baseline":
        parts.append(_speedup(row, baseline))
        parts.append(_acceptance(row, imposed=spec.synthetic))
    parts.append(took)
    status = "unstable" if row.get("unstable") else "ok"
    notes = [f"unstable: {row.get('unstable_reason')}"] if row.get("unstable") else []
    if row.get("outputs_match_baseline") is False:
        notes.append("greedy outputs differ from the baseline's (the summary says why)")
    return f"{label}: {status}, {', '.join(parts)}" + "".join(f"; {note}" for note in notes)


def _speedup(row: dict[str, Any], baseline: str) -> str:
    speedup, low, high = (row.get(key) for key in ("speedup", "speedup_ci_low", "speedup_ci_high"))
    if speedup is None:
        return {"pending": "speedup after the baseline", "failed": "no speedup (the baseline failed)"}.get(
            baseline, "speedup -")
    interval = f"95% CI {low:.2f}-{high:.2f}" if low is not None and high is not None else "no CI from one prompt"
    return f"speedup {speedup:.2f}x ({interval})"


def _acceptance(row: dict[str, Any], *, imposed: bool) -> str:
    rate, length = row.get("acceptance_rate"), row.get("mean_accepted_length")
    text = f"acceptance {_number(rate, '.0%')}" + (" imposed" if imposed else "")
    return text + (f", mean accepted length {length:.2f}" if length is not None else "")


def _number(value: Any, spec: str) -> str:
    return "-" if value is None else f"{value:{spec}}"
