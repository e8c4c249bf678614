"""The launched engine's lifeline: this script starts the engine and ends its whole process group when specbench
goes away, however it goes (kill -9 included). specbench holds the write end of a pipe whose read end this process
watches; the kernel closes that end when specbench dies, the read returns end-of-file, and this process SIGKILLs its
process group: the engine, every worker it forked, and itself. A parent-death signal (prctl PR_SET_PDEATHSIG)
would reach the engine only, not the workers a Python engine (vLLM, SGLang) forks. The launch's scratch folder
(SPECBENCH_SCRATCH, where the engine keeps its sockets) goes first: nothing of the engine is left.

Run as a script, standard library only (`python -I -S lifeline.py FD ARGV...`, in its own session): it starts in
milliseconds and exits with the engine's own status."""

import os
import shutil
import signal
import subprocess
import sys
import threading


def _watch(fd: int, scratch: str | None) -> None:
    while os.read(fd, 1):  # specbench never writes: this returns only at end-of-file, when it is gone
        pass
    if scratch:  # before the kill, which ends this process too; the engine cannot make files in a folder gone
        shutil.rmtree(scratch, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    fd, command = int(argv[0]), argv[1:]
    scratch = os.environ.pop("SPECBENCH_SCRATCH", None)  # the lifeline's to remove; the engine does not see it
    engine = subprocess.Popen(command)  # inherits this session, the log as stdout and stderr, and no pipe end
    # specbench stops an engine by SIGTERM to the whole group: the engine answers it, this process waits for it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch, args=(fd, scratch), daemon=True).start()
    code = engine.wait()
    if code < 0:  # killed by a signal: die of the same one, so specbench reads the engine's own status
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
