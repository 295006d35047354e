"""Finds and loads libPPPBridgeC.so, declares the C API's signatures (pppbridge.h), and keeps
every callback the library may call alive for as long as its handle is (a ctypes callback that
is collected while C still holds it would be a jump into freed memory)."""
import atexit
import ctypes
import os
import threading

DID_OPEN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
DID_CLOSE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
SERVICE_EVENT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
CONNECTION = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)

_NAME = "libPPPBridgeC.so"


def _candidates():
    explicit = os.environ.get("PPPBRIDGE_LIB")
    if explicit:
        # Named by the user: that one or none, so a mistake is not hidden by another copy.
        yield explicit
        return
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), _NAME)
    if os.path.exists(here):
        yield here
    yield _NAME


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path, use_errno=True)
        except OSError as e:
            errors.append(f"{path}: {e}")
    raise ImportError("libPPPBridgeC.so not found (set PPPBRIDGE_LIB to its path): " + "; ".join(errors))


lib = _load()

_c = ctypes.c_void_p
_signatures = {
    "pb_channel_create": (_c, [ctypes.c_char_p, _c, DID_OPEN, DID_CLOSE]),
    "pb_open_channel": (ctypes.c_int, [_c]),
    "pb_close_channel": (ctypes.c_int, [_c]),
    "pb_add_host_to_terminal_bridge": (ctypes.c_int, [_c, ctypes.c_uint16]),
    "pb_add_host_to_terminal_bridge_local": (ctypes.c_int, [_c, ctypes.c_uint16]),
    "pb_add_terminal_to_host_bridge": (ctypes.c_int, [_c, ctypes.c_uint16]),
    "pb_remove_bridge": (ctypes.c_int, [_c, ctypes.c_int, ctypes.c_uint16]),
    "pb_set_keepalive": (ctypes.c_int, [_c, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint]),
    "pb_ip": (ctypes.c_char_p, [_c]),
    "pb_submask": (ctypes.c_char_p, [_c]),
    "pb_dns": (ctypes.c_char_p, [_c]),
    "pb_terminal_ip": (ctypes.c_char_p, [_c]),
    "pb_channel_destroy": (ctypes.c_int, [_c]),
    "pb_set_connection_callback": (ctypes.c_int, [_c, CONNECTION]),
    "pb_service_open": (_c, [ctypes.c_char_p, SERVICE_EVENT, _c]),
    "pb_service_request": (ctypes.c_int, [_c, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
    "pb_service_add_bridge": (ctypes.c_int, [_c, ctypes.c_char_p, ctypes.c_char_p]),
    "pb_service_remove_bridge": (ctypes.c_int, [_c, ctypes.c_char_p, ctypes.c_char_p]),
    "pb_service_close": (ctypes.c_int, [_c]),
}
for _name, (_result, _arguments) in _signatures.items():
    _f = getattr(lib, _name)
    _f.restype = _result
    _f.argtypes = _arguments


# The library's one loop thread, learnt from its first callback: the calls that wait for that
# thread (destroy, close, a wait for an event) refuse to run on it.
_library_thread = None


def note_library_thread():
    global _library_thread
    _library_thread = threading.get_ident()


def on_library_thread():
    return _library_thread is not None and threading.get_ident() == _library_thread


# handle -> (its callbacks, how to free it): released only once the library let go of it.
_kept = {}
_kept_lock = threading.Lock()


def keep(handle, callbacks, free):
    with _kept_lock:
        _kept[handle] = (callbacks, free)


def release(handle):
    with _kept_lock:
        _kept.pop(handle, None)


@atexit.register
def _free_all():
    # Before the interpreter goes: no callback may run into a finalising one.
    with _kept_lock:
        handles = list(_kept.items())
        _kept.clear()
    if on_library_thread():
        return
    for handle, (_callbacks, free) in handles:
        try:
            free(handle)
        except Exception:
            pass
