#!/usr/bin/env python3
"""A hostile terminal: crafted IPv4 at the host role's address, from inside the network
namespace whose TUN interface is the terminal end of the link (the tests' KernelLink).

    hostile-peer.py fragments-beyond-end HOST     three 8-byte fragments: 1000 (more), 16 (last), 0 (more)
    hostile-peer.py oversized-datagram HOST       fragments of a 65575-byte datagram (40 option bytes)
    hostile-peer.py empty-fragments HOST COUNT    zero-length first fragments from random sources
    hostile-peer.py syn-flood HOST PORT COUNT     SYNs from random sources and ports, never completed
    hostile-peer.py connect-storm HOST PORT COUNT real connections (the kernel's TCP), up to 256 held at once
    hostile-peer.py echo HOST [BYTES]             the echo service (port 7) still answers, byte for byte

Raw packets go out through a SOCK_RAW/IPPROTO_RAW socket (the header is ours, source
addresses included). Each command prints one line of figures and exits 0 when it ran.
"""
import os
import random
import socket
import struct
import sys
import time


def checksum(data):
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack(f">{len(data) // 2}H", data))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ipv4(src, dst, proto, payload, ident, offset=0, more=False, options=b"", total=None):
    ihl = (20 + len(options)) // 4
    flags = (0x2000 if more else 0) | (offset // 8)
    h = struct.pack(">BBHHHBBH4s4s", 0x40 | ihl, 0, total or 4 * ihl + len(payload), ident, flags, 64, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst)) + options
    return h[:10] + struct.pack(">H", checksum(h)) + h[12:] + payload


def raw_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
    return s


def send_all(packets, host, pace=0):
    s = raw_socket()
    sent = 0
    for p in packets:
        while True:
            try:
                s.sendto(p, (host, 0))
                break
            except (BlockingIOError, OSError) as e:
                # ENOBUFS: the TUN's queue is full; the link drains it.
                if getattr(e, "errno", None) not in (105, 11):
                    raise
                time.sleep(0.001)
        sent += 1
        if pace and sent % pace == 0:
            time.sleep(0.001)
    return sent


def local_address(host):
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    probe.connect((host, 9))
    return probe.getsockname()[0]


def fragments_beyond_end(host):
    me = local_address(host)
    eight = bytes(8)
    packets = [ipv4(me, host, 17, eight, 77, 1000, True), ipv4(me, host, 17, eight, 77, 16, False),
               ipv4(me, host, 17, eight, 77, 0, True)]
    print(f"sent {send_all(packets, host)} fragments")


def oversized_datagram(host):
    me = local_address(host)
    # UDP to a port nobody binds (the ICMP error path would quote the datagram): 8-byte
    # header plus 65507 bytes, 65515 in all; 40 option bytes make the datagram 65575 bytes.
    udp = struct.pack(">HHHH", 5353, 9999, 8 + 65507, 0) + bytes(65507)
    options = bytes([1] * 40)
    packets = []
    offset = 0
    first_room = (1500 - 60) // 8 * 8
    room = (1500 - 20) // 8 * 8
    while offset < len(udp):
        n = min(first_room if offset == 0 else room, len(udp) - offset)
        more = offset + n < len(udp)
        packets.append(ipv4(me, host, 17, udp[offset:offset + n], 4242, offset, more, options if offset == 0 else b""))
        offset += n
    print(f"sent {send_all(packets, host)} fragments of a {60 + len(udp)}-byte datagram")


def empty_fragments(host, count):
    rnd = random.Random(13)
    packets = (ipv4(socket.inet_ntoa(struct.pack(">I", rnd.randrange(0x01000000, 0xDF000000))), host, 17, b"",
                    rnd.randrange(65536), 0, True) for _ in range(count))
    started = time.monotonic()
    sent = send_all(packets, host, pace=64)
    print(f"sent {sent} empty fragments in {time.monotonic() - started:.1f} s")


def syn_flood(host, port, count):
    rnd = random.Random(17)
    me = local_address(host)
    packets = []
    for _ in range(count):
        sport = rnd.randrange(1024, 65536)
        tcp = struct.pack(">HHIIBBHHH", sport, port, rnd.randrange(1 << 32), 0, 5 << 4, 0x02, 65535, 0, 0)
        pseudo = socket.inet_aton(me) + socket.inet_aton(host) + struct.pack(">BBH", 0, 6, len(tcp))
        tcp = tcp[:16] + struct.pack(">H", checksum(pseudo + tcp)) + tcp[18:]
        packets.append(ipv4(me, host, 6, tcp, rnd.randrange(65536)))
    print(f"sent {send_all(packets, host, pace=64)} SYNs")


def connect_storm(host, port, count):
    held, refused, timeouts, established = [], 0, 0, 0
    for _ in range(count):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.settimeout(10)
        try:
            s.connect((host, port))
            established += 1
            held.append(s)
        except ConnectionRefusedError:
            refused += 1
            s.close()
        except (socket.timeout, OSError):
            timeouts += 1
            s.close()
        if len(held) >= 256:
            for h in held:
                h.close()
            held = []
    for h in held:
        h.close()
    print(f"attempts {count} established {established} refused {refused} failed {timeouts}")


def echo(host, size):
    data = os.urandom(size)
    with socket.create_connection((host, 7), timeout=30) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        back = b""
        while len(back) < size:
            chunk = s.recv(65536)
            if not chunk:
                break
            back += chunk
    ok = back == data
    print(f"echo {'intact' if ok else 'BROKEN'} {len(back)} of {size} bytes")
    sys.exit(0 if ok else 1)


def main():
    command, host = sys.argv[1], sys.argv[2]
    args = [int(a) for a in sys.argv[3:]]
    {
        "fragments-beyond-end": lambda: fragments_beyond_end(host),
        "oversized-datagram": lambda: oversized_datagram(host),
        "empty-fragments": lambda: empty_fragments(host, args[0]),
        "syn-flood": lambda: syn_flood(host, args[0], args[1]),
        "connect-storm": lambda: connect_storm(host, args[0], args[1]),
        "echo": lambda: echo(host, args[0] if args else 4096),
    }[command]()


if __name__ == "__main__":
    main()
