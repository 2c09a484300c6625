"""An S3-compatible server (moto) on 127.0.0.1 for the remote-cache tests and benchmark."""

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


def start_s3_server() -> tuple[subprocess.Popen, dict[str, str]]:
    """Start `moto.server`, create `BUCKET`; the process and the environment a client
    needs (dummy credentials, the endpoint through fsspec's config variables)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto.server did not start") from None
            time.sleep(0.2)
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
