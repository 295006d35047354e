"""One PPP link to a terminal: ICPPP's channel over pb_channel_* (pppbridge.h)."""
import ctypes
import dataclasses
import enum
import json
import os
import threading
import typing

from ._library import CONNECTION, DID_CLOSE, DID_OPEN, lib
from .errors import ChannelClosed, CloseReason, InvalidArgument, OpenFailed, check
from .events import EventQueue


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

    Events (`Opened`, `Closed`, and a `Connection` for each connection through a bridge or the
    proxy) come through `next_event()` and `events()`; a callable given as
    `on_library_thread` is called with each on the library's thread (keep it short; it must not
    close or destroy the channel's handle itself: `destroy()` from it raises).
    """

    def __init__(self, device, on_library_thread=None):
        if not isinstance(device, str) or not device:
            raise InvalidArgument("device must be a non-empty string")
        self.device = device
        self._events = EventQueue()
        self._on_library_thread = on_library_thread
        self._state = threading.Condition()
        self._generation = 0
        self._last = None  # Opened or Closed
        self._library_thread = None
        # Kept for the channel's life: ctypes frees a callback whose object is collected.
        self._did_open = DID_OPEN(self._opened)
        self._did_close = DID_CLOSE(self._closed)
        self._connection_callback = CONNECTION(self._connection)
        handle = lib.pb_channel_create(device.encode(), None, self._did_open, self._did_close)
        if not handle:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), device)
        self._handle = handle
        lib.pb_set_connection_callback(handle, self._connection_callback)

    # -- callbacks, on the library's thread --

    def _opened(self, _handle, _context):
        try:
            self._library_thread = threading.get_ident()
            event = Opened(self._addresses())
            self._record(event)
        except Exception:  # never into the C caller
            pass

    def _closed(self, _handle, reason, _context):
        try:
            self._library_thread = threading.get_ident()
            self._record(Closed(CloseReason.of(reason)))
        except Exception:
            pass

    def _connection(self, _handle, text, _context):
        try:
            self._library_thread = threading.get_ident()
            event = Connection.from_json(text.decode("utf-8", "replace"))
            self._events.put(event)
            if self._on_library_thread is not None:
                self._on_library_thread(event)
        except Exception:
            pass

    def _record(self, event):
        with self._state:
            self._last = event
            self._generation += 1
            self._state.notify_all()
        self._events.put(event)
        if self._on_library_thread is not None:
            self._on_library_thread(event)

    # -- the calls --

    def _live(self):
        if self._handle is None:
            raise InvalidArgument("the channel was destroyed")
        return self._handle

    def open(self, timeout=None):
        """Starts opening the link. With `timeout` (seconds), waits for it: returns the
        `Addresses`, raises `ChannelClosed` when it closed first, `TimeoutError` when neither
        came in time. Raises `OpenFailed` when the device could not be opened at all."""
        with self._state:
            generation = self._generation
        code = lib.pb_open_channel(self._live())
        if code == OpenFailed.code:
            raise OpenFailed(f"{self.device}: the device could not be opened")
        check(code)
        if timeout is None:
            return None
        with self._state:
            if not self._state.wait_for(lambda: self._generation != generation, timeout):
                raise TimeoutError(f"{self.device}: the link did not open within {timeout} s")
            last = self._last
        if isinstance(last, Closed):
            raise ChannelClosed(last.reason)
        return last.addresses

    def close(self, timeout=None):
        """Closes the link (LCP Terminate-Request). With `timeout`, waits for it to be closed
        and returns the reason (None if it did not close in time)."""
        with self._state:
            generation = self._generation
            already = isinstance(self._last, Closed) or self._last is None
        check(lib.pb_close_channel(self._live()))
        if timeout is None or already:
            return None
        with self._state:
            self._state.wait_for(lambda: self._generation != generation and isinstance(self._last, Closed), timeout)
            return self._last.reason if isinstance(self._last, Closed) else None

    def add_bridge(self, kind, port):
        """Adds a bridge; raises the exception for ICPPP's code (`BridgeExists`, ...)."""
        check(_ADD[BridgeKind(kind)](self._live(), port))

    def remove_bridge(self, kind, port):
        check(lib.pb_remove_bridge(self._live(), int(BridgeKind(kind)), port))

    def set_keepalive(self, idle, interval, count):
        """TCP keep-alive for the terminal's connections through the proxy (seconds, seconds,
        probes); `InvalidArgument` for values the kernel does not take."""
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
        """The next event (`Opened`, `Closed`) not yet taken, waiting up to `timeout`
        seconds; None when none came."""
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
        Twice is harmless."""
        if self._handle is None:
            return
        if threading.get_ident() == self._library_thread:
            raise RuntimeError("destroy() from a callback on the library's thread")
        lib.pb_channel_destroy(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._handle is not None and isinstance(self._last, Opened):
            self.close(timeout=5)
        self.destroy()
        return False

    def __del__(self):
        try:
            if self._handle is not None and threading.get_ident() != self._library_thread:
                lib.pb_channel_destroy(self._handle)
                self._handle = None
        except Exception:
            pass
