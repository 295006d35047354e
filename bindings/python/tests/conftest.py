"""A simulated terminal for the tests: `pppbridge simulate` (our stack in the terminal role, on
a pty, serving echo) as a child process, and the library the bindings load."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BINARY = os.environ.get("PPPBRIDGE_BINARY", os.path.join(ROOT, ".build", "debug", "pppbridge"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Terminal:
    """One simulated terminal; its pty linked at `device`, echo on `echo_port`."""

    def __init__(self, directory):
        self.directory = directory
        self.echo_port = free_port()
        self.device = os.path.join(directory, "t0")
        self.log = open(os.path.join(directory, "simulate.log"), "wb")
        self.process = subprocess.Popen([BINARY, "simulate", "--terminals", "1", "--dir", directory,
                                         "--echo-base", str(self.echo_port)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while not os.path.islink(self.device):
            if time.time() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError("the simulator made no pty: " + open(self.log.name).read())
            time.sleep(0.05)

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def directory():
    d = tempfile.mkdtemp(prefix="pppbridge-py-")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def terminal(directory):
    t = Terminal(directory)
    yield t
    t.stop()


def echo(port, payload, timeout=20):
    """Sends `payload` to 127.0.0.1:`port` and returns what comes back before the other side
    closes (after our half-close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        back = bytearray()
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return bytes(back)
            back += chunk
