"""`fleetllm serve` as a subprocess on a free port, for end-to-end tests and benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from fleetllm.serve.replica_http import bind
from fleetllm.serve.replica_http import free_port as free_port_at


def free_port() -> int:
    """A port nothing listens on at 127.0.0.1 now."""
    return free_port_at("127.0.0.1")


class ServeProcess:
    """Writes a serve.yaml, starts `python -m fleetllm serve` and waits until /health answers 200."""

    def __init__(self, spec: dict[str, Any], workdir: str | Path, env: dict[str, str] | None = None,
                 start_timeout_s: float = 300, port: int | None = None) -> None:
        self.port = port or free_port()
        self.spec = {**spec, "host": "127.0.0.1", "port": self.port}
        self.path = Path(workdir) / "serve.yaml"
        self.path.write_text(yaml.safe_dump(self.spec))
        self.log_path = Path(workdir) / "serve.log"
        self.env = {**os.environ, **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "ServeProcess":
        import httpx

        self._log = open(self.log_path, "a")
        # its own process group: kill() takes the local Ray it starts with it, as a crash of the machine would
        self.proc = subprocess.Popen([sys.executable, "-m", "fleetllm", "serve", str(self.path)],
                                     stdout=self._log, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"fleetllm serve exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"fleetllm serve did not come up in {self.start_timeout_s}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 90) -> int:
        """SIGTERM, wait for a clean exit (kill after `timeout_s`); returns the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL the server, its process group and every process under it (the local Ray it started: GCS,
        raylet, replicas, HTTP proxy; Ray starts some in sessions of their own), as a crash of the machine
        would; returns once the port is free."""
        import psutil

        if self.proc is not None and self.proc.poll() is None:
            family = psutil.Process(self.proc.pid).children(recursive=True)
            os.killpg(self.proc.pid, signal.SIGKILL)
            for child in family:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            self.proc.wait()
        self._log.close()
        with contextlib.suppress(OSError):  # free as `fleetllm serve` checks it: nothing listening (TIME_WAIT is fine)
            bind("127.0.0.1", self.port, wait_s=60).close()

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
