"""A real S3 API server on 127.0.0.1 for tests and benchmarks: moto's server mode (`moto[server]`).

    with S3Server() as s3:
        s3.make_bucket("bkt")
        subprocess.run([...], env=s3.env())   # AWS_ENDPOINT_URL and test credentials

fleetllm itself is configured only through the environment (boto's AWS_* variables), as a user's
job would be against AWS, MinIO or any S3-compatible store.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_SESSION_TOKEN": "testing"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def env(self, base: dict | None = None) -> dict[str, str]:
        """The environment a process needs to reach this server (the endpoint and credentials)."""
        env = dict(os.environ if base is None else base)
        env.update(CREDENTIALS, AWS_ENDPOINT_URL=self.endpoint)
        return env

    def __enter__(self) -> "S3Server":
        server = Path(sys.executable).with_name("moto_server")
        cmd = [str(server)] if server.exists() else [sys.executable, "-m", "moto.server"]
        self.proc = subprocess.Popen([*cmd, "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                urllib.request.urlopen(self.endpoint + "/moto-api/", timeout=1)
                return self
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError("moto_server exited at start; is moto[server] installed?") from None
                time.sleep(0.2)
        self.__exit__()
        raise RuntimeError(f"moto_server did not answer on {self.endpoint} within 60 s")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def apply_env(self) -> None:
        """Point this process's S3 clients at the server (tests and benchmarks only)."""
        os.environ.update(self.env({}))

    @staticmethod
    @contextlib.contextmanager
    def serving(bucket: str):
        """A server with `bucket`, this process's S3 clients pointed at it (s3fs's cache cleared) for the
        block; the environment is restored after (tests' module fixtures)."""
        import s3fs

        saved = dict(os.environ)
        try:
            with S3Server() as server:
                server.apply_env()
                s3fs.S3FileSystem.clear_instance_cache()
                server.make_bucket(bucket)
                yield server
        finally:
            os.environ.clear()
            os.environ.update(saved)
            s3fs.S3FileSystem.clear_instance_cache()

    def make_bucket(self, name: str) -> None:
        import s3fs

        s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint}, key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                          secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"]).mkdir(name)

    def arrow_fs(self):
        """pyarrow's own S3 filesystem on this server (what pyarrow and Ray Data read with)."""
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{self.port}", scheme="http",
                                 access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                                 secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"], region="us-east-1")
