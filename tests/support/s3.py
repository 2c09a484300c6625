"""Servers on 127.0.0.1 for the remote-cache tests and benchmark: an S3-compatible one (moto)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

BUCKET = "morello-test"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen, what: str, seconds: float = 30) -> None:
    """Return once `proc` listens on 127.0.0.1:`port`; kill it and raise if it does not."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.2)


def start_s3_server() -> tuple[subprocess.Popen, dict[str, str]]:
    """Start `moto.server`, create `BUCKET`; the process and the environment a client
    needs (dummy credentials, the endpoint through fsspec's config variables)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for_port(port, proc, "moto.server")
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret-never-printed",
        "AWS_DEFAULT_REGION": "us-east-1",
        "FSSPEC_S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
    }
    subprocess.run(
        [sys.executable, "-c", f"import s3fs; s3fs.S3FileSystem().mkdir({BUCKET!r})"],
        env={**os.environ, **env},
        check=True,
        timeout=60,
    )
    return proc, env


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
