"""Fixtures of the Python client tests: a real attnaudit-server on a
kernel-chosen loopback port, and the attnaudit CLI.

The binaries come from $ATTNAUDIT_SERVER / $ATTNAUDIT_CLI (set by ctest,
tests/python/CMakeLists.txt), else from build/bin of this checkout. Nothing
leaves 127.0.0.1, and every wait is bounded.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _binary(env: str, name: str) -> str:
    path = os.environ.get(env) or os.path.join(REPO, "build", "bin", name)
    if not os.access(path, os.X_OK):
        pytest.fail(f"{name} not found at {path}: build it, or set ${env}")
    return path


class Server:
    """One attnaudit-server process with a private data directory."""

    def __init__(self, binary: str, *extra: str):
        self.dir = tempfile.mkdtemp(prefix="attnaudit_pytest_")
        self.log_path = os.path.join(self.dir, "server.log")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [binary, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
             "--data-dir", os.path.join(self.dir, "data"), "--drain-timeout", "5s",
             *extra],
            stdout=subprocess.DEVNULL, stderr=self._log)
        self.address = self._wait_for_port()

    def _wait_for_port(self) -> str:
        pattern = re.compile(rb'msg="grpc listening" addr=127\.0\.0\.1:(\d+)')
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with open(self.log_path, "rb") as f:
                m = pattern.search(f.read())
            if m:
                return f"127.0.0.1:{int(m.group(1))}"
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        self.stop()
        raise RuntimeError("attnaudit-server did not start:\n" + self.log())

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-4000:]

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
        subprocess.run(["rm", "-rf", self.dir], check=False)


@pytest.fixture(scope="session")
def server_bin() -> str:
    return _binary("ATTNAUDIT_SERVER", "attnaudit-server")


@pytest.fixture(scope="session")
def cli_bin() -> str:
    return _binary("ATTNAUDIT_CLI", "attnaudit")


@pytest.fixture(scope="session")
def server(server_bin):
    s = Server(server_bin, "--cpu-workers", "2", "--threads-per-job", "1")
    yield s
    s.stop()


@pytest.fixture
def make_server(server_bin):
    """A factory for private servers (extra flags), stopped after the test."""
    started = []

    def make(*extra: str) -> Server:
        s = Server(server_bin, *extra)
        started.append(s)
        return s

    yield make
    for s in started:
        s.stop()


@pytest.fixture(scope="session")
def client(server):
    import attnaudit
    c = attnaudit.AuditClient(server.address, timeout=60)
    c.wait_for_ready(20)
    yield c
    c.close()


class Cli:
    def __init__(self, binary: str):
        self.binary = binary

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([self.binary, *args], capture_output=True, timeout=120)
        if check and p.returncode not in (0, 1):
            raise AssertionError(f"attnaudit {' '.join(args)} exited {p.returncode}: "
                                 + p.stderr.decode(errors="replace"))
        return p

    def synth(self, path: str, *args: str) -> str:
        self.run("synth", *args, "-o", path)
        return path

    def check_json(self, path: str, *args: str) -> dict:
        return json.loads(self.run("check", path, "--json", *args).stdout)


@pytest.fixture(scope="session")
def cli(cli_bin) -> Cli:
    return Cli(cli_bin)


def comparable(report_dict: dict) -> dict:
    """A report (proto3 JSON as a dict) without what legitimately differs
    between two runs on the same data: wall times, the thread count, and
    the RoPE identity digest (it covers the page pool's placement)."""
    d = json.loads(json.dumps(report_dict))
    prov = d.get("provenance", {})
    for k in ("timings", "threads", "rope_fingerprint"):
        prov.pop(k, None)
    return d


def report_json(report) -> dict:
    """The report the way `attnaudit check --json` prints it."""
    from google.protobuf import json_format
    return json.loads(json_format.MessageToJson(
        report.proto, preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True))
