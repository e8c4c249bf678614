"""The profile's [server] table: how the server backend reaches a serving engine. Validated where the profile
enters (one-line errors naming the key)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, StrictStr, ValidationInfo, field_validator, model_validator

from specbench.profile.fields import NonNegativeInt, PositiveFloat, PositiveInt, Table
from specbench.profile.references import base_dir
from specbench.profile.validation import URL_PATTERN, rule, show

class ServerSpec(Table):
    """How the server backend reaches a serving engine: launch it (engine, optional argv template and
    binary), or attach to one already running (url)."""

    engine: Literal["llama.cpp", "vllm", "sglang", "openai"]
    command: tuple[StrictStr, ...] | None = None  # argv template: {target} {draft} {host} {port}; never a shell
    binary: StrictStr | None = None  # the engine's executable (llama-server) or the Python that has it (vllm, sglang)
    url: StrictStr | None = None
    model: StrictStr | None = None  # the served model name to request (default: the first the server lists)
    ready_timeout_s: PositiveFloat | None = None  # default: from the weights' size (backends/server/placement.py)
    gpus: tuple[NonNegativeInt, ...] | None = None  # the GPUs (NVML/nvidia-smi indices) it may use; default: all visible
    tensor_parallel: PositiveInt = 1  # GPUs per launch: vLLM --tensor-parallel-size, SGLang --tp-size, llama.cpp split
    request_timeout_s: PositiveFloat | None = None  # one request, send to last byte (default: 60 s + 1 s per token)
    point_timeout_s: PositiveFloat | None = None  # one point (default: its requests each using their whole deadline)
    extra_args: tuple[StrictStr, ...] = ()
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict)
    api_key_env: StrictStr | None = None  # the environment variable holding the API key (never the key)

    @field_validator("binary")
    @classmethod
    def _binary_path(cls, binary: str | None, info: ValidationInfo) -> str | None:
        """A path (with a separator) is relative to the profile's folder; a bare name is looked up on PATH."""
        if binary is None or os.sep not in binary:
            return binary
        path = Path(binary).expanduser()  # not resolved: a virtualenv's python is a link that must stay one
        return os.path.abspath(path if path.is_absolute() else base_dir(info) / path)

    @model_validator(mode="after")
    def _launch_or_attach(self) -> "ServerSpec":
        if self.url is not None:
            if not re.fullmatch(URL_PATTERN, self.url):
                raise rule(f'must be "http://HOST:PORT" (got {show(self.url)})', at=("url",))
            for key in ("command", "binary"):
                if getattr(self, key) is not None:
                    raise rule("not used with url: nothing is launched (remove one of them)", at=(key,))
        elif self.engine == "openai":
            raise rule('engine "openai" attaches to a running server: set url = "http://HOST:PORT"', at=("url",))
        if self.url is not None and (self.gpus is not None or self.tensor_parallel != 1):
            raise rule("not used with url: the attached server already runs on its GPUs (remove it)",
                       at=("gpus" if self.gpus is not None else "tensor_parallel",))
        if self.gpus is not None:
            if len(set(self.gpus)) != len(self.gpus) or not self.gpus:
                raise rule(f"must list each GPU once, at least one (got {list(self.gpus)})", at=("gpus",))
            if self.tensor_parallel > len(self.gpus):
                raise rule(f"{self.tensor_parallel} GPUs per launch, but server.gpus lists {len(self.gpus)}: list more "
                           "GPUs or lower tensor_parallel", at=("tensor_parallel",))
        return self
