"""pppbridge: PPP links to payment terminals, from Python (over libPPPBridgeC, with ctypes)."""
from .channel import Addresses, BridgeKind, Channel, Closed, Connection, Opened
from .errors import (BadRequest, BridgeExists, BridgeInitFailed, BridgeNotStarted, ChannelClosed, CloseReason, Error,
                     InvalidArgument, NoMoreBridges, NoSuchBridge, NoSuchTerminal, OpenFailed)
from .service import Service

__all__ = ["Addresses", "BridgeKind", "Channel", "Closed", "Connection", "Opened", "Service", "Error", "BadRequest", "BridgeExists",
           "BridgeInitFailed", "BridgeNotStarted", "ChannelClosed", "CloseReason", "InvalidArgument", "NoMoreBridges",
           "NoSuchBridge", "NoSuchTerminal", "OpenFailed"]
