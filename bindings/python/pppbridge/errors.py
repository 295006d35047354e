"""Exceptions carrying the C API's (ICPPP's) codes, and the reasons a link closes."""
import enum


class Error(Exception):
    """Something the library refused; `code` is its number from pppbridge.h."""

    code = 0

    def __init__(self, message="", code=None):
        if code is not None:
            self.code = code
        super().__init__(message or f"{type(self).__name__} ({self.code})")


class NoMoreBridges(Error):
    """At most 12 bridges (ICPPP's -1)."""
    code = -1


class BridgeExists(Error):
    """That bridge is there already (-2)."""
    code = -2


class BridgeNotStarted(Error):
    """The channel is not open (-3)."""
    code = -3


class BridgeInitFailed(Error):
    """The port could not be listened on (-4)."""
    code = -4


class NoSuchBridge(Error):
    """None of that kind on that port (-5)."""
    code = -5


class InvalidArgument(Error):
    """A channel that is gone, a port of 0, values out of range (-6)."""
    code = -6


class OpenFailed(Error):
    """The device could not be opened (-7)."""
    code = -7


class NoSuchTerminal(Error):
    """The service has no terminal of that name (-8)."""
    code = -8


class BadRequest(Error):
    """Not a request the service takes (-9)."""
    code = -9


class ChannelClosed(Error):
    """The link closed (before it opened, or while waited on); `reason` says why."""

    def __init__(self, reason):
        self.reason = CloseReason.of(reason)
        name = getattr(self.reason, "name", "unknown").lower()
        super().__init__(f"the channel closed: {name} ({int(self.reason)})", code=int(self.reason))


_BY_CODE = {c.code: c for c in (NoMoreBridges, BridgeExists, BridgeNotStarted, BridgeInitFailed, NoSuchBridge,
                                InvalidArgument, OpenFailed, NoSuchTerminal, BadRequest)}


def check(code, message=""):
    """Raises the exception for a negative code; returns 0 and positive values as they are."""
    if code >= 0:
        return code
    cls = _BY_CODE.get(code)
    if cls is None:
        raise Error(message or f"code {code}", code=code)
    raise cls(message)


class CloseReason(enum.IntEnum):
    """Why a channel closed: pppd's exit statuses for the same causes (pppbridge.h)."""

    CLOSED_BY_US = 0
    LINE_FAILED = 7
    NEGOTIATION = 10
    AUTHENTICATION = 11
    ECHO_TIMEOUT = 15
    HANG_UP = 16
    LOOPBACK = 17
    PEER_TERMINATED = 22

    @classmethod
    def of(cls, value):
        try:
            return cls(value)
        except ValueError:
            # A code a newer library added: kept as a plain number rather than refused.
            return value
