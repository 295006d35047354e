import os

import pytest

import pppbridge
from conftest import echo, free_port


def wait_for(service, kind, terminal, timeout=30):
    import time
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        event = service.next_event(timeout=max(0.1, deadline - time.time()))
        if event is None:
            break
        seen.append(event)
        if event.get("event") == kind and event.get("terminal") == terminal:
            return event
    raise AssertionError(f"no {kind} event for {terminal}: {seen}")


def test_the_service_runs_a_terminal_from_its_file(terminal, directory):
    conf = os.path.join(directory, "conf")
    os.mkdir(conf)
    path = os.path.join(conf, "lane1.conf")
    with open(path, "w") as f:
        f.write(f"device {terminal.device}\nbridge local:{terminal.echo_port}\nholdoff 1\n")
    os.chmod(path, 0o600)
    with pppbridge.Service(conf) as service:
        opened = wait_for(service, "opened", "lane1")
        assert opened.get("terminal_ip") == "192.168.53.2"
        assert [(t["name"], t["state"]) for t in service.list()] == [("lane1", "open")]
        payload = os.urandom(100_000)
        assert echo(terminal.echo_port, payload) == payload

        extra = free_port()
        service.add_bridge("lane1", f"host:{extra}")
        with pytest.raises(pppbridge.BridgeExists):
            service.add_bridge("lane1", f"host:{extra}")
        service.remove_bridge("lane1", f"host:{extra}")
        with pytest.raises(pppbridge.NoSuchTerminal):
            service.status("lane9")
        with pytest.raises(pppbridge.BadRequest):
            service.request({"cmd": "no-such-request"})
        assert service.status("lane1")["state"] == "open"
    with pytest.raises(pppbridge.InvalidArgument):
        service.list()
