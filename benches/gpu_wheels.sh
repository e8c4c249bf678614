#!/usr/bin/env bash
# The wheels the GPU check (benches/gpu_check.sh) needs beyond what the GPU machine's image holds, into .gpu-wheels/
# (git-ignored), to be carried there with the working tree (make gpu-wheels; docs/gpu.md). That image has torch,
# transformers, typer, rich, pandas, pyarrow, numpy, scipy, pytest, aiohttp and nvidia-ml-py, but not what `import
# benches` pulls in through the backends and profiles (pydantic with pydantic-core, annotated-types and
# typing-inspection, platformdirs, tomli-w; typing-extensions as new as pydantic asks). The rest of specbench's
# runtime comes too, so that `specbench run` works there: optuna with alembic, SQLAlchemy, Mako and colorlog, gguf,
# psycopg2-binary, and nvidia-ml-py and prometheus-client in case the image's are older. Each at this checkout's
# virtualenv's version, built for CPython 3.12 on x86-64 Linux (the GPU machine's python3), no dependencies resolved.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
LIMIT_MIB=40  # the working tree that travels is 64 MiB in all
WHEELS=(pydantic pydantic-core annotated-types typing-inspection typing-extensions platformdirs tomli-w
        optuna alembic sqlalchemy mako colorlog gguf psycopg2-binary nvidia-ml-py prometheus-client)
specs=$("$PYTHON" -c 'import sys, importlib.metadata as m; print(*(f"{n}=={m.version(n)}" for n in sys.argv[1:]))' \
        "${WHEELS[@]}")
rm -rf .gpu-wheels
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpu-wheels $specs
size_kib=$(du -sk .gpu-wheels | cut -f1)
echo "gpu-wheels: $(ls .gpu-wheels | wc -l) wheels, $((size_kib / 1024)) MiB in .gpu-wheels/: $specs"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
    echo "gpu-wheels: more than $LIMIT_MIB MiB; carry fewer (WHEELS in $0)" >&2
    exit 1
fi
