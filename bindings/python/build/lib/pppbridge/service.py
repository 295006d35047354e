"""Many terminals from a configuration directory: `pppbridge serve` as a library
(pb_service_*, pppbridge.h)."""
import ctypes
import json
import os
import threading

from ._library import SERVICE_EVENT, lib
from .errors import InvalidArgument, check
from .events import EventQueue

_REPLY_SIZE = 1 << 20


class Service:
    """Opens `directory` (one NAME.conf per terminal, the format of `pppbridge serve --help`)
    and runs its terminals on the library's loop. Events are dicts as the control socket sends
    them (`{"event": "opened", "terminal": "t1", ...}`), through `next_event()` and
    `events()`; `on_library_thread`, if given, is called with each on the library's thread."""

    def __init__(self, directory, on_library_thread=None):
        if not isinstance(directory, str) or not directory:
            raise InvalidArgument("directory must be a non-empty string")
        self.directory = directory
        self._events = EventQueue()
        self._on_library_thread = on_library_thread
        self._library_thread = None
        self._callback = SERVICE_EVENT(self._event)
        handle = lib.pb_service_open(directory.encode(), self._callback, None)
        if not handle:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), directory)
        self._handle = handle

    def _event(self, _handle, text, _context):
        try:
            self._library_thread = threading.get_ident()
            event = json.loads(text.decode("utf-8", "replace"))
            self._events.put(event)
            if self._on_library_thread is not None:
                self._on_library_thread(event)
        except Exception:
            pass

    def _live(self):
        if self._handle is None:
            raise InvalidArgument("the service was closed")
        return self._handle

    def request(self, request):
        """One control request (a dict: `{"cmd": "list"}`); returns the reply as a dict, or
        raises the exception for its code (`NoSuchTerminal`, `BridgeExists`, ...)."""
        reply = ctypes.create_string_buffer(_REPLY_SIZE)
        code = lib.pb_service_request(self._live(), json.dumps(request).encode(), reply, _REPLY_SIZE)
        answer = json.loads(reply.value.decode("utf-8", "replace") or "{}")
        check(code, answer.get("error", ""))
        return answer

    def list(self):
        """The terminals, each a dict with its name, state and addresses."""
        return self.request({"cmd": "list"}).get("terminals", [])

    def status(self, terminal):
        return self.request({"cmd": "status", "terminal": terminal}).get("terminal", {})

    def add_bridge(self, terminal, bridge):
        """`bridge` is host:PORT, local:PORT or terminal:PORT, kept whenever the link opens."""
        check(lib.pb_service_add_bridge(self._live(), terminal.encode(), bridge.encode()))

    def remove_bridge(self, terminal, bridge):
        check(lib.pb_service_remove_bridge(self._live(), terminal.encode(), bridge.encode()))

    def next_event(self, timeout=None):
        return self._events.next(timeout)

    def events(self):
        return self._events.iterate()

    def close(self):
        """Closes every link (at most 5 s) and frees the service. Twice is harmless."""
        if self._handle is None:
            return
        if threading.get_ident() == self._library_thread:
            raise RuntimeError("close() from a callback on the library's thread")
        lib.pb_service_close(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._handle is not None and threading.get_ident() != self._library_thread:
                lib.pb_service_close(self._handle)
                self._handle = None
        except Exception:
            pass
