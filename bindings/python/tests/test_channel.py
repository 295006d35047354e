import asyncio
import os

import pytest

import pppbridge
from conftest import echo, free_port


def test_a_channel_opens_carries_a_bridge_and_closes(terminal):
    with pppbridge.Channel(terminal.device) as channel:
        addresses = channel.open(timeout=30)
        assert addresses == pppbridge.Addresses(ip="192.168.53.1", submask="255.255.255.255", dns="192.168.53.1",
                                                terminal_ip="192.168.53.2")
        assert channel.addresses == addresses
        assert channel.next_event(timeout=5) == pppbridge.Opened(addresses)

        channel.add_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL_LOCAL, terminal.echo_port)
        payload = os.urandom(200_000)
        assert echo(terminal.echo_port, payload) == payload
        # That connection, opened and closed under one number, with its bytes each way.
        opened, closed = channel.next_event(timeout=10), channel.next_event(timeout=10)
        assert isinstance(opened, pppbridge.Connection) and opened.phase == "opened"
        assert opened.bridge == f"local:{terminal.echo_port}" and not opened.proxy
        assert opened.destination == f"192.168.53.2:{terminal.echo_port}" and opened.source.startswith("127.0.0.1:")
        assert closed.phase == "closed" and closed.number == opened.number > 0
        assert (closed.bytes_to_terminal, closed.bytes_to_host, closed.failure) == (200_000, 200_000, None)

        with pytest.raises(pppbridge.BridgeExists) as e:
            channel.add_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL_LOCAL, terminal.echo_port)
        assert e.value.code == -2
        channel.remove_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL_LOCAL, terminal.echo_port)
        with pytest.raises(pppbridge.NoSuchBridge) as e:
            channel.remove_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL_LOCAL, terminal.echo_port)
        assert e.value.code == -5

        channel.set_keepalive(60, 10, 5)
        with pytest.raises(pppbridge.InvalidArgument):
            channel.set_keepalive(0, 10, 5)

        assert channel.close(timeout=15) == pppbridge.CloseReason.CLOSED_BY_US
        assert channel.next_event(timeout=5) == pppbridge.Closed(pppbridge.CloseReason.CLOSED_BY_US)
        assert channel.addresses is None
        with pytest.raises(pppbridge.BridgeNotStarted):
            channel.add_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL, free_port())


def test_events_in_asyncio_arrive_on_the_programs_loop(terminal):
    async def scenario():
        channel = pppbridge.Channel(terminal.device)
        loop_thread = asyncio.get_running_loop()
        seen = []

        async def watch():
            async for event in channel.events():
                # On this loop, not the library's thread.
                assert asyncio.get_running_loop() is loop_thread
                seen.append(event)
                if isinstance(event, pppbridge.Closed):
                    return

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0)
        channel.open()
        while not seen:
            await asyncio.sleep(0.05)
        assert isinstance(seen[0], pppbridge.Opened)
        channel.close()
        await asyncio.wait_for(watcher, 15)
        channel.destroy()
        return seen

    seen = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [type(e) for e in seen] == [pppbridge.Opened, pppbridge.Closed]
    assert seen[1].reason == pppbridge.CloseReason.CLOSED_BY_US


def test_callbacks_on_the_library_thread_only_when_asked(terminal):
    import threading
    threads = []
    channel = pppbridge.Channel(terminal.device, on_library_thread=lambda e: threads.append(threading.get_ident()))
    channel.open(timeout=30)
    assert threads and threads[0] != threading.get_ident()
    channel.close(timeout=15)
    channel.destroy()


def test_a_missing_device_fails_to_open(directory):
    channel = pppbridge.Channel(os.path.join(directory, "no-such-device"))
    with pytest.raises(pppbridge.OpenFailed) as e:
        channel.open()
    assert e.value.code == -7
    assert channel.next_event(timeout=5) == pppbridge.Closed(pppbridge.CloseReason.LINE_FAILED)
    channel.destroy()


def test_a_destroyed_channel_refuses_every_call(directory):
    channel = pppbridge.Channel(os.path.join(directory, "no-such-device"))
    channel.destroy()
    channel.destroy()
    with pytest.raises(pppbridge.InvalidArgument):
        channel.add_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL, 5000)
    with pytest.raises(pppbridge.InvalidArgument):
        channel.open()


def test_open_times_out_on_a_silent_line(directory):
    # A pty nobody answers on: the link does not open in a second.
    import pty
    controller, terminal_side = pty.openpty()
    try:
        channel = pppbridge.Channel(os.ttyname(terminal_side))
        with pytest.raises(TimeoutError):
            channel.open(timeout=1)
        channel.destroy()
    finally:
        os.close(controller)
        os.close(terminal_side)
