import asyncio
import os

import pytest

import pppbridge
from conftest import echo, free_port


def test_a_channel_opens_carries_a_bridge_and_closes(terminal):
    with pppbridge.Channel(terminal.device, connection_events=True) as channel:
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


def test_callbacks_run_on_the_library_thread_when_asked_and_may_not_wait_there(terminal):
    import threading
    seen = []

    def callback(event):
        refused = None
        try:
            channel.close(timeout=1)
        except RuntimeError as e:
            refused = e
        seen.append((threading.get_ident(), type(event), refused))

    channel = pppbridge.Channel(terminal.device, on_library_thread=callback)
    channel.open(timeout=30)
    # On another thread than this one; a wait for the library's thread refused there.
    assert seen and seen[0][0] != threading.get_ident() and seen[0][1] is pppbridge.Opened
    assert isinstance(seen[0][2], RuntimeError)
    channel.close(timeout=15)
    channel.destroy()


def test_ports_out_of_range_are_refused_not_wrapped(terminal):
    with pppbridge.Channel(terminal.device) as channel:
        channel.open(timeout=30)
        for port in (0, 65536, 70000, -1):
            with pytest.raises(pppbridge.InvalidArgument):
                channel.add_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL_LOCAL, port)
        with pytest.raises(pppbridge.InvalidArgument):
            channel.set_keepalive(-1, 10, 5)


def test_a_missing_device_fails_to_open(directory):
    channel = pppbridge.Channel(os.path.join(directory, "no-such-device"))
    with pytest.raises(pppbridge.OpenFailed) as e:
        channel.open()
    assert e.value.code == -7
    assert channel.next_event(timeout=5) == pppbridge.Closed(pppbridge.CloseReason.LINE_FAILED)
    channel.destroy()


def test_a_destroyed_channel_refuses_every_call(directory):
    from pppbridge._library import lib
    channel = pppbridge.Channel(os.path.join(directory, "no-such-device"))
    stale = channel._handle
    channel.destroy()
    channel.destroy()
    with pytest.raises(pppbridge.InvalidArgument):
        channel.add_bridge(pppbridge.BridgeKind.HOST_TO_TERMINAL, 5000)
    with pytest.raises(pppbridge.InvalidArgument):
        channel.open()
    # The library itself, called with the stale handle: PB_INVALID, nothing followed.
    assert lib.pb_open_channel(stale) == -6
    assert lib.pb_add_host_to_terminal_bridge(stale, 5000) == -6
    assert lib.pb_channel_destroy(stale) == -6
    assert lib.pb_ip(stale) == b""


def test_open_times_out_on_a_silent_line(directory):
    # A pty nobody answers on: the link does not open in a second.
    import pty
    controller, terminal_side = pty.openpty()
    try:
        with pppbridge.Channel(os.ttyname(terminal_side)) as channel:
            with pytest.raises(TimeoutError):
                channel.open(timeout=1)
    finally:
        os.close(controller)
        os.close(terminal_side)
