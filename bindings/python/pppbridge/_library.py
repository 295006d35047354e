"""Finds and loads libPPPBridgeC.so, and declares the C API's signatures (pppbridge.h)."""
import ctypes
import os

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
