"""The machine's name as specbench records it (manifests, shards, tune workers): `SPECBENCH_HOST`, else the host
name. Set it where host names repeat (containers, cloned images) or to name a box for a test."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

HOST_ENV = "SPECBENCH_HOST"


def host_name(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(HOST_ENV) or socket.gethostname()
