#!/usr/bin/env python3
"""The Linux kernel's TCP as a client of pppbridge's stack, run inside a network namespace
whose TUN interface carries the PPP link. Each command prints one result line.

  echo HOST PORT SIZE           send SIZE random bytes, half-close, read the echo back;
                                prints "echo sent=N received=N equal=True|False"
  concurrent HOST PORT N SIZE   N connections at once, each an echo of SIZE bytes;
                                prints "concurrent ok=K of N"
  chargen HOST PORT SIZE        read SIZE bytes and check RFC 864's pattern; prints "chargen ok=..."
  daytime HOST PORT SIZE        read the time and the server's FIN (it half-closes first), then
                                keep sending SIZE bytes and close; prints "daytime ..." with
                                the bytes sent after EOF and whether the close was clean
  reset HOST PORT               connect, then close with SO_LINGER 0 (an RST); prints "reset sent"
  refused HOST PORT             connect to a port nobody listens on; prints "refused" on RST
  ss HOST PORT                  hold a connection open and print the kernel's `ss -tin` line
                                for it and the options tcp_info reports
"""
import hashlib
import os
import socket
import struct
import subprocess
import sys
import threading

TIMEOUT = 300


def echo(host, port, size):
    data = os.urandom(size)
    s = socket.create_connection((host, port), timeout=TIMEOUT)
    got = bytearray()

    def reader():
        while True:
            b = s.recv(1 << 16)
            if not b:
                break
            got.extend(b)

    t = threading.Thread(target=reader)
    t.start()
    s.sendall(data)
    # Half-close: our FIN goes out while the echo keeps coming back.
    s.shutdown(socket.SHUT_WR)
    t.join(TIMEOUT)
    s.close()
    equal = hashlib.sha256(bytes(got)).digest() == hashlib.sha256(data).digest()
    return size, len(got), equal, hashlib.sha256(data).hexdigest()


def chargen_line(i):
    return bytes(0x20 + (i + k) % 95 for k in range(72)) + b"\r\n"


def main():
    cmd, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if cmd == "echo":
        sent, received, equal, digest = echo(host, port, int(sys.argv[4]))
        print(f"echo sent={sent} received={received} equal={equal} sha256={digest}")
    elif cmd == "concurrent":
        n, size = int(sys.argv[4]), int(sys.argv[5])
        results = [None] * n

        def one(i):
            try:
                results[i] = echo(host, port, size)[2]
            except OSError as e:
                results[i] = False
                print(f"connection {i}: {e}", file=sys.stderr)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        print(f"concurrent ok={sum(1 for r in results if r)} of {n}")
    elif cmd == "chargen":
        size = int(sys.argv[4])
        s = socket.create_connection((host, port), timeout=TIMEOUT)
        got = bytearray()
        while len(got) < size:
            b = s.recv(1 << 16)
            if not b:
                break
            got.extend(b)
        s.close()
        expected = bytearray()
        i = 0
        while len(expected) < size:
            expected.extend(chargen_line(i))
            i += 1
        print(f"chargen ok={bytes(got[:size]) == bytes(expected[:size])} bytes={min(len(got), size)}")
    elif cmd == "daytime":
        size = int(sys.argv[4])
        s = socket.create_connection((host, port), timeout=TIMEOUT)
        line = bytearray()
        while True:
            b = s.recv(1024)
            if not b:
                break
            line.extend(b)
        # The server's FIN is in; our direction is still open.
        s.sendall(os.urandom(size))
        s.shutdown(socket.SHUT_WR)
        try:
            clean = s.recv(1) == b""
        except ConnectionResetError:
            clean = False
        s.close()
        print(f"daytime sent_after_eof={size} clean={clean} line={line.decode().strip()!r}")
    elif cmd == "reset":
        s = socket.create_connection((host, port), timeout=TIMEOUT)
        s.sendall(b"x" * 100)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
        print("reset sent")
    elif cmd == "refused":
        try:
            socket.create_connection((host, port), timeout=30).close()
            print("connected")
        except ConnectionRefusedError:
            print("refused")
    elif cmd == "ss":
        s = socket.create_connection((host, port), timeout=TIMEOUT)
        s.sendall(b"y" * 10000)
        out = subprocess.run(["ss", "-tin", "dst", f"{host}:{port}"], capture_output=True, text=True).stdout
        print(" ".join(out.split()))
        # tcp_info's options byte too: some ss builds do not print "ts" and "sack".
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        options, scales = info[5], info[6]
        names = [n for bit, n in ((1, "ts"), (2, "sack"), (4, "wscale")) if options & bit]
        print(f"tcp_info options: {' '.join(names)} snd_wscale={scales & 15} rcv_wscale={scales >> 4}")
        s.close()
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
