"""Many terminals from a configuration directory: `pppbridge serve` as a library
(pb_service_*, pppbridge.h)."""
import ctypes
import json
import os
import sys
import weakref

from . import _library
from ._library import SERVICE_EVENT, lib
from .errors import Error, InvalidArgument, check
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
        self._handle = None
        # Held weakly by its callback, which the library module keeps until the service is
        # closed (see Channel).
        me = weakref.ref(self)

        def event(_h, text, _c):
            _library.note_library_thread()
            service = me()
            if service is not None:
                service._event(json.loads(text.decode("utf-8", "replace")))

        callback = SERVICE_EVENT(event)
        handle = lib.pb_service_open(directory.encode(), callback, None)
        if not handle:
            e = ctypes.get_errno()
            raise OSError(e, os.strerror(e), directory)
        _library.keep(handle, (callback,), lib.pb_service_close)
        self._handle = handle

    def _event(self, event):
        self._events.put(event)
        if self._on_library_thread is not None:
            try:
                self._on_library_thread(event)
            except Exception:
                sys.excepthook(*sys.exc_info())

    def _live(self):
        if self._handle is None:
            raise InvalidArgument("the service was closed")
        return self._handle

    def request(self, request):
        """One control request (a dict: `{"cmd": "list"}`); returns the reply as a dict, or
        raises the exception for its code (`NoSuchTerminal`, `BridgeExists`, ...)."""
        reply = ctypes.create_string_buffer(_REPLY_SIZE)
        code = lib.pb_service_request(self._live(), json.dumps(request).encode(), reply, _REPLY_SIZE)
        if len(reply.value) >= _REPLY_SIZE - 1:
            raise Error(f"the reply is longer than {_REPLY_SIZE - 1} bytes (cut)")
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
        if _library.on_library_thread():
            raise RuntimeError("close() on the library's thread (from a callback)")
        code = lib.pb_service_close(self._handle)
        if code != 0:
            raise InvalidArgument(f"the library refused to close the service ({code})", code=code)
        _library.release(self._handle)
        self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._handle is not None and not _library.on_library_thread():
                self.close()
        except Exception:
            pass
