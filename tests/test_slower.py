"""benches/slower.sh: the machine made slower for as long as a command runs (one real-time spinner per core), and
nothing of it left once the command ends or the script is killed. How much slower is measured, not asserted here
(docs/measurements.md: a calibration beside each use)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benches" / "slower.sh"
# the spinners, by what each runs: "<its temporary folder>/slower CPU FRACTION"
LIST_SPINNERS = """
import os
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        if argv[0].endswith(b"/slower") and state != "Z":
            print(pid, os.sched_getscheduler(int(pid)) == os.SCHED_FIFO, *sorted(os.sched_getaffinity(int(pid))),
                  argv[2].decode())
    except (OSError, IndexError):
        pass
"""

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0 or not sys.platform.startswith("linux"),
                                reason="the spinners need root on Linux (real-time priority)")


def spinners(others: frozenset[str] = frozenset()) -> list[str]:
    """The spinners running now, but those in `others`: a test's own, where the suite itself runs under slower.sh."""
    listed = subprocess.run([sys.executable, "-c", LIST_SPINNERS], capture_output=True, text=True, check=True).stdout
    return [row for row in listed.split("\n")[:-1] if row not in others]


@pytest.fixture
def others() -> frozenset[str]:
    """The spinners of a slower.sh this suite runs under (docs/development.md's dress rehearsal), not the test's."""
    return frozenset(spinners())


@needs_root
def test_one_real_time_spinner_per_core_while_the_command_runs_and_none_after(tmp_path, others):
    listed = tmp_path / "spinners"
    result = subprocess.run([str(SCRIPT), "2", sys.executable, "-c",
                             f"import subprocess, sys; open({str(listed)!r}, 'w').write(subprocess.run([sys.executable, "
                             f"'-c', {LIST_SPINNERS!r}], capture_output=True, text=True).stdout); sys.exit(3)"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr  # the command's own status
    rows = [line.split() for line in listed.read_text().splitlines() if line not in others]
    assert sorted(int(row[2]) for row in rows) == sorted(os.sched_getaffinity(0))  # one per core, pinned to it
    assert all(row[1] == "True" and row[3] == "0.5000" for row in rows), rows  # SCHED_FIFO, half of each core
    assert spinners(others) == []


@needs_root
def test_killed_with_kill_9_it_leaves_no_spinner_running(others):
    script = subprocess.Popen([str(SCRIPT), "3", "sleep", "60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(spinners(others)) < len(os.sched_getaffinity(0)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(spinners(others)) == len(os.sched_getaffinity(0))
        script.kill()
        script.wait()
        deadline = time.monotonic() + 10
        while spinners(others) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert spinners(others) == []  # each died with its parent
    finally:
        os.killpg(script.pid, signal.SIGKILL)  # the orphaned sleep


@pytest.mark.parametrize("factor, command, message", [
    ("1", True, "benches/slower.sh: FACTOR 1 is not a number above 1 and at most 5"),
    ("6", True, "benches/slower.sh: FACTOR 6 is not a number above 1 and at most 5"),
    ("fast", True, "benches/slower.sh: FACTOR fast is not a number above 1 and at most 5"),
    ("2", False, "usage: benches/slower.sh FACTOR COMMAND... (FACTOR: how many times slower, above 1 and at most 5)"),
], ids=["1", "6", "fast", "no command"])
def test_a_bad_factor_or_no_command_is_one_line_exit_2_and_nothing_run(tmp_path, others, factor, command, message):
    marker = tmp_path / "ran"
    result = subprocess.run([str(SCRIPT), factor, *(["touch", str(marker)] if command else [])],
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr.strip(), result.stdout) == (2, message, "")
    assert not marker.exists() and spinners(others) == []


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None, reason="no C compiler")
def test_a_spinner_whose_starter_is_already_gone_exits_at_once(tmp_path):
    """A spinner is told its starter's pid: one whose starter died before it could ask to die with it (reparented
    already) exits at once instead of spinning at real-time priority for good (pid 1 is never this test's)."""
    binary = tmp_path / "slower"
    subprocess.run([os.environ.get("CC", "cc"), "-O2", "-o", str(binary), str(SCRIPT.with_suffix(".c"))], check=True)
    assert subprocess.run([str(binary), "0", "0.5", "1"], timeout=10).returncode == 1
    usage = subprocess.run([str(binary), "0", "0.5"], capture_output=True, text=True, timeout=10)
    assert usage.returncode == 2 and usage.stderr.startswith("usage: slower CPU FRACTION PARENT")
