"""A real `mlx-spec serve` process on 127.0.0.1 and a free port, for the server and page tests."""

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]  # this checkout, imported first by the server process
# The package's processes run as on a user's Mac, without torch (without_torch/sitecustomize.py).
WITHOUT_TORCH = str(Path(__file__).with_name("without_torch"))
ENV = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
           PYTHONPATH=os.pathsep.join([WITHOUT_TORCH, str(ROOT), os.environ.get("PYTHONPATH", "")]))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, procs, output, timeout: float) -> None:
    """Until `url`/health answers 200; fails at once if one of `procs` exits, with `output()`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise AssertionError(f"the server exited with {proc.returncode}:\n{output()}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"the server did not start:\n{output()}")


class Server:
    def __init__(self, checkpoints, *args):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "mlx_spec.cli", "serve", "--model", str(checkpoints["text"]),
                "--drafter", str(checkpoints["assistant"]), "--port", str(self.port), "--log-level", "warning", *args]
        self.log = tempfile.TemporaryFile("w+")  # read back on failure; gone when closed, nothing left in /tmp
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self, timeout: float = 120.0) -> None:
        wait_healthy(self.url, [self.proc], self.output, timeout)

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=5.0).json()

    def wait_idle(self, timeout: float) -> float:
        """Seconds until the model is free and no request waits; fails after `timeout`."""
        start = time.time()
        while time.time() - start < timeout:
            h = self.health()
            if h["running"] == 0 and h["waiting"] == 0:
                return time.time() - start
            time.sleep(0.05)
        raise AssertionError(f"still busy after {timeout} s: {self.health()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
