"""A real tidemark server per test: the binary named by ``TIDEMARK_BIN`` (the e2e suite sets
it to the workspace's build; default ``target/debug/tidemark``), its own data directory, a
fixed port so that a restart after ``kill -9`` comes back at the same address."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, config: str | None = None):
        self.dir = tempfile.TemporaryDirectory(prefix="tidemark-py-")
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.config = None
        if config is not None:
            self.config = Path(self.dir.name) / "tidemark.toml"
            self.config.write_text(config)
        self.proc: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        binary = os.environ.get("TIDEMARK_BIN", str(ROOT / "target" / "debug" / "tidemark"))
        cmd = [binary, "serve", "--data", str(Path(self.dir.name) / "data"),
               "--listen", f"127.0.0.1:{self.port}"]
        if self.config is not None:
            cmd += ["--config", str(self.config)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDEMARK_")}
        env["RUST_LOG"] = "warn"
        self.stderr = open(Path(self.dir.name) / "stderr.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.stderr, env=env)
        line = self.proc.stdout.readline().decode()
        assert line.startswith("listening on"), f"the server did not start: {line!r}"
        deadline = time.time() + 60
        import httpx

        while time.time() < deadline:
            try:
                if httpx.get(self.base + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise AssertionError("the server never became ready")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.start()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.proc = None
        self.dir.cleanup()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def make_server():
    made = []

    def make(config: str | None = None) -> Server:
        s = Server(config)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()
