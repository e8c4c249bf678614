#!/usr/bin/env bash
# The GPU check on a GPU machine, with no network (make gpu-check; docs/gpu.md): installs the carried wheels
# (.gpu-wheels/, made by benches/gpu_wheels.sh) into .gpu-site/, each only where the image lacks it or holds an older
# version (never torch, which is in none of them), then runs `python -m benches.gpu_check` on the GPU under a timeout
# of GPU_CHECK_LIMIT_S (480 s), writing gpu-check.json and gpu-check.log into $OUT (default ./gpu-check).
# Extra arguments go to the check.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-gpu-check}
LIMIT_S=${GPU_CHECK_LIMIT_S:-480}
mkdir -p "$OUT"
if compgen -G ".gpu-wheels/*.whl" >/dev/null; then
    needed=$("$PYTHON" - .gpu-wheels/*.whl <<'PY'
import importlib.metadata as metadata
import sys
from pathlib import Path

try:
    from packaging.version import Version
except ImportError:  # pip carries its own
    from pip._vendor.packaging.version import Version

for wheel in sys.argv[1:]:
    name, version = Path(wheel).name.split("-")[:2]
    try:
        have = metadata.version(name)
    except metadata.PackageNotFoundError:
        have = None
    if have is None or Version(have) < Version(version):
        print(wheel)
PY
    ) || exit 1
    if [ -n "$needed" ]; then
        echo "gpu-check: installing into .gpu-site/:" $needed
        # shellcheck disable=SC2086  # one argument per wheel
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target .gpu-site $needed || exit 1
    fi
fi
export PYTHONPATH=.:.gpu-site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
timeout -k 10 "$LIMIT_S" "$PYTHON" -m benches.gpu_check --out "$OUT" --time-limit-s $((LIMIT_S - 30)) "$@" 2>&1 \
    | tee "$OUT/gpu-check.log"
status=${PIPESTATUS[0]}
[ "$status" -ne 124 ] || echo "gpu-check: stopped after $LIMIT_S s; $OUT/gpu-check.json holds the phases that finished"
exit "$status"
