"""One PPP link to a terminal: ICPPP's channel over pb_channel_* (pppbridge.h)."""
import ctypes
import dataclasses
import enum
import json
import os
import threading
import sys
import typing
import weakref

from . import _library
from ._library import CONNECTION, DID_CLOSE, DID_OPEN, lib
from .errors import ChannelClosed, CloseReason, InvalidArgument, OpenFailed, check
from .events import EventQueue


def _port(port):
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise InvalidArgument(f"a port is 1 to 65535, not {port!r}")
    return port


def _report():
    """An exception from the program's callback on the library's thread: said, never raised
    into the C caller."""
    sys.excepthook(*sys.exc_info())


class BridgeKind(enum.IntEnum):
    """pb_remove_bridge's kinds (ICPPP's three bridges)."""

    HOST_TO_TERMINAL = 0        # listening on every host interface
    HOST_TO_TERMINAL_LOCAL = 1  # listening on 127.0.0.1 only
    TERMINAL_TO_HOST = 2        # listening on our PPP address, connecting to the host's port


@dataclasses.dataclass(frozen=True)
class Addresses:
    """ICPPP's four addresses, as dotted quads."""

    ip: str
    submask: str
    dns: str
    terminal_ip: str


@dataclasses.dataclass(frozen=True)
class Opened:
    addresses: Addresses


@dataclasses.dataclass(frozen=True)
class Closed:
    reason: CloseReason


@dataclasses.dataclass(frozen=True)
class Connection:
    """One connection through a bridge or the proxy (ICNetwork's per-connection calls):
    `phase` "opened", "closed" (its bytes each way, and `failure` when it did not end
    cleanly) or "refused" (never made; `failure` says why). `number` is shared by a
    connection's opened and closed events (0 for a refusal); `bridge` is "host:5000" and the
    like, None for the proxy; `destination` is the terminal's port, the host's, or what the
    terminal asked the proxy for."""

    phase: str
    number: int
    bridge: typing.Optional[str]
    destination: str
    source: str
    failure: typing.Optional[str] = None
    bytes_to_terminal: int = 0
    bytes_to_host: int = 0

    @property
    def proxy(self):
        return self.bridge is None

    @classmethod
    def from_json(cls, text):
        o = json.loads(text)
        return cls(phase=o.get("event", "").replace("connection-", ""), number=o.get("connection", 0), bridge=o.get("bridge"),
                   destination=o.get("destination", ""), source=o.get("source", ""), failure=o.get("failure"),
                   bytes_to_terminal=o.get("bytes_to_terminal", 0), bytes_to_host=o.get("bytes_to_host", 0))


_ADD = {
    BridgeKind.HOST_TO_TERMINAL: lib.pb_add_host_to_terminal_bridge,
    BridgeKind.HOST_TO_TERMINAL_LOCAL: lib.pb_add_host_to_terminal_bridge_local,
    BridgeKind.TERMINAL_TO_HOST: lib.pb_add_terminal_to_host_bridge,
}


class Channel:
    """A channel on `device`: a serial device, a pty, or `tcp:HOST:PORT` / `rfc2217:HOST:PORT`
    on a device server. Host role: we are 192.168.53.1, the terminal 192.168.53.2.

    Events (`Opened`, `Closed`, and with `connection_events=True` a `Connection` for each
    connection through a bridge or the proxy) come through `next_event()` and `events()`; a
    callable given as `on_library_thread` is called with each on the library's thread (keep
    it short; the calls that wait for that thread, `destroy()` and a timed `open()`/`close()`,
    raise `RuntimeError` there).
    """

    def __init__(self, device, on_library_thread=None, connection_events=False):
        if not isinstance(device, str) or not device:
            raise InvalidArgument("device must be a non-empty string")
        self.device = device
        self._events = EventQueue()
        self._on_library_thread = on_library_thread
        self._state = threading.Condition()
        self._generation = 0
        self._last = None  # Opened or Closed
        self._link = "closed"  # closed, opening, open, closing: what was asked and heard
        self._closes_expected = 0
        self._handle = None
        # The callbacks hold the channel weakly, and are kept by the library module until the
        # handle is destroyed: collecting the channel never frees what C may still call.
        me = weakref.ref(self)

        def did_open(_h, _c):
            _library.note_library_thread()
            channel = me()
            if channel is not None:
                channel._record(Opened(channel._addresses()))

        def did_close(_h, reason, _c):
            _library.note_library_thread()
            channel = me()
            if channel is not None:
                channel._record(Closed(CloseReason.of(reason)))

        def connection(_h, text, _c):
            _library.note_library_thread()
            channel = me()
            if channel is not None:
                channel._record(Connection.from_json(text.decode("utf-8", "replace")))

        callbacks = (DID_OPEN(did_open), DID_CLOSE(did_close), CONNECTION(connection))
        handle = lib.pb_channel_create(device.encode(), None, callbacks[0], callbacks[1])
        if not handle:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), device)
        _library.keep(handle, callbacks, lib.pb_channel_destroy)
        self._handle = handle
        if connection_events:
            lib.pb_set_connection_callback(handle, callbacks[2])

    # -- from the library's thread --

    def _record(self, event):
        with self._state:
            if isinstance(event, Opened):
                self._link = "open"
            elif isinstance(event, Closed):
                self._link = "closed"
                self._closes_expected = max(0, self._closes_expected - 1)
            if not isinstance(event, Connection):
                self._last = event
                self._generation += 1
                self._state.notify_all()
        self._events.put(event)
        if self._on_library_thread is not None:
            try:
                self._on_library_thread(event)
            except Exception:
                _report()

    # -- the calls --

    def _live(self):
        if self._handle is None:
            raise InvalidArgument("the channel was destroyed")
        return self._handle

    def _may_wait(self, what):
        if _library.on_library_thread():
            raise RuntimeError(f"{what} with a timeout on the library's thread would wait for that very thread")

    def open(self, timeout=None):
        """Starts opening the link. With `timeout` (seconds), waits for it: returns the
        `Addresses`, raises `ChannelClosed` when it closed first, `TimeoutError` when neither
        came in time. Raises `OpenFailed` when the device could not be opened at all."""
        if timeout is not None:
            self._may_wait("open()")
        with self._state:
            generation = self._generation
            # A close still under way ends with its own did-close: not this open's answer.
            skip = self._closes_expected
        code = lib.pb_open_channel(self._live())
        if code == OpenFailed.code:
            raise OpenFailed(f"{self.device}: the device could not be opened")
        check(code)
        with self._state:
            if self._link != "open":
                self._link = "opening"
        if timeout is None:
            return None
        with self._state:
            def answered():
                # Events since the call; the first `skip` are the closes that were under way.
                n = self._generation - generation
                return n > 0 and (isinstance(self._last, Opened) or n > skip)

            if not self._state.wait_for(answered, timeout):
                raise TimeoutError(f"{self.device}: the link did not open within {timeout} s")
            last = self._last
        if isinstance(last, Closed):
            raise ChannelClosed(last.reason)
        return last.addresses

    def close(self, timeout=None):
        """Closes the link (LCP Terminate-Request). With `timeout`, waits for it to be closed
        and returns the reason (None when it was not open or opening, or did not close in
        time)."""
        if timeout is not None:
            self._may_wait("close()")
        with self._state:
            generation = self._generation
            active = self._link in ("opening", "open", "closing")
            if active:
                self._link = "closing"
                self._closes_expected += 1
        check(lib.pb_close_channel(self._live()))
        if timeout is None or not active:
            return None
        with self._state:
            done = self._state.wait_for(lambda: self._generation != generation and isinstance(self._last, Closed), timeout)
            return self._last.reason if done else None

    def add_bridge(self, kind, port):
        """Adds a bridge; raises the exception for ICPPP's code (`BridgeExists`, ...)."""
        check(_ADD[BridgeKind(kind)](self._live(), _port(port)))

    def remove_bridge(self, kind, port):
        check(lib.pb_remove_bridge(self._live(), int(BridgeKind(kind)), _port(port)))

    def set_keepalive(self, idle, interval, count):
        """TCP keep-alive for the terminal's connections through the proxy (seconds, seconds,
        probes); `InvalidArgument` for values the kernel does not take."""
        for v in (idle, interval, count):
            if not isinstance(v, int) or not 0 <= v <= 0xFFFF_FFFF:
                raise InvalidArgument(f"keep-alive values are whole numbers the kernel takes, not {v!r}")
        check(lib.pb_set_keepalive(self._live(), idle, interval, count))

    def _addresses(self):
        h = self._live()
        text = lambda f: (f(h) or b"").decode()  # noqa: E731
        return Addresses(text(lib.pb_ip), text(lib.pb_submask), text(lib.pb_dns), text(lib.pb_terminal_ip))

    @property
    def addresses(self):
        """The four addresses while open; None while closed."""
        a = self._addresses()
        return a if a.ip else None

    # -- events --

    def next_event(self, timeout=None):
        """The next event (`Opened`, `Closed`, `Connection`) not yet taken, waiting up to
        `timeout` seconds; None when none came."""
        return self._events.next(timeout)

    def events(self):
        """Every event from now on, in the calling task's asyncio loop:
        `async for event in channel.events(): ...`."""
        return self._events.iterate()

    @property
    def events_dropped(self):
        return self._events.dropped

    # -- lifetime --

    def destroy(self):
        """Frees the channel, closing the link without a word if it is up; no event follows.
        Twice is harmless. Not from the library's thread (`RuntimeError`)."""
        if self._handle is None:
            return
        if _library.on_library_thread():
            raise RuntimeError("destroy() on the library's thread (from a callback)")
        code = lib.pb_channel_destroy(self._handle)
        if code != 0:
            raise InvalidArgument(f"the library refused to destroy the channel ({code})", code=code)
        _library.release(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            if self._handle is not None and self._link in ("opening", "open"):
                self.close(timeout=5)
        finally:
            self.destroy()
        return False

    def __del__(self):
        # Collected on the library's thread (the collector runs where it allocates), the
        # handle stays until exit: its callbacks, kept by the library module, find no channel.
        try:
            if self._handle is not None and not _library.on_library_thread():
                self.destroy()
        except Exception:
            pass
