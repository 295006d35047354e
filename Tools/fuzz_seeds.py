#!/usr/bin/env python3
"""Writes fuzzing seeds from the shared traces.

stream:  4 setting bytes (FCS-16, ACCM 0 and 0xFFFFFFFF, MRU 1560, a chunk stride) followed by
         the raw async bytes of each direction of each pppd record file.
packets: each capture record's bytes, once for each of the target's four packet parsers, and
         SOCKS4/4a/5 handshakes (with and without a password) for the proxy's parser.
messages: reader-protocol frames (the specification's message shapes), one and several per input.
stack:   a flags byte, then the IPv4 packets of each capture, eight at a time, each behind a
         2-byte length; and made-up exchanges (a TCP connection to port 80, fragments, UDP).
channel: SOCKS handshakes behind a selector byte, and DNS relay operations (queries, answers,
         time, closes).
session: a scene byte (pairing, a bond, auto-reconnect), then a script of records (op, 2-byte
         length, payload) for the host's reader session: answers to its requests, reader events
         and device requests, time, calls, lost links; whole flows (login, payment, signature,
         reversal, a drop and its recovery, an update, a pairing).
link:    a flags byte, then PPP frames (protocol and information, each behind a 2-byte length):
         a terminal's whole session (LCP, PAP or CHAP, IPCP, then the stack's exchanges).
replay:  each pppd record file as it is, and its frames as the target's session format (a flags
         byte, then per frame a side/time byte, a 2-byte length, protocol and information), whole
         and cut to the first 16 KiB, for each choice of peer.
Only seeds are made here; the project's readers (libpcap, the record reader) are what is fuzzed.
"""
import os
import struct
import sys


def record_streams(data):
    """The sent and received byte streams of a pppd record file."""
    streams = {1: bytearray(), 2: bytearray()}
    i = 0
    while i < len(data):
        tag = data[i]
        if tag == 7 or tag == 5:
            i += 5
        elif tag == 6:
            i += 2
        elif tag in (3, 4):
            i += 1
        elif tag in (1, 2):
            n = struct.unpack(">H", data[i + 1:i + 3])[0]
            streams[tag] += data[i + 3:i + 3 + n]
            i += 3 + n
        else:
            break
    return streams.values()


def record_frames(data):
    """The PPP frames of a pppd record file in line order: (received, tenths since the frame
    before, protocol and information), de-framed as RFC 1662 says (seed material only)."""
    pending = {1: bytearray(), 2: bytearray()}
    frames = []
    i, tenths, last = 0, 0, 0
    while i < len(data):
        tag = data[i]
        if tag == 7:
            i += 5
        elif tag == 5:
            tenths += struct.unpack(">I", data[i + 1:i + 5])[0]
            i += 5
        elif tag == 6:
            tenths += data[i + 1]
            i += 2
        elif tag in (3, 4):
            i += 1
        elif tag in (1, 2):
            n = struct.unpack(">H", data[i + 1:i + 3])[0]
            for b in data[i + 3:i + 3 + n]:
                if b != 0x7E:
                    pending[tag].append(b)
                    continue
                raw, pending[tag] = pending[tag], bytearray()
                out, escaped = bytearray(), False
                for c in raw:
                    if c == 0x7D:
                        escaped = True
                    elif escaped:
                        out.append(c ^ 0x20)
                        escaped = False
                    else:
                        out.append(c)
                body = bytes(out[:-2])
                if body[:2] == b"\xff\x03":
                    body = body[2:]
                if len(body) < 2:
                    continue
                if body[0] & 1:
                    body = b"\x00" + body
                frames.append((tag == 2, min(tenths - last, 127), body))
                last = tenths
            i += 3 + n
        else:
            break
    return frames


def pcap_records(data):
    """Record payloads of a classic pcap file (seed material only)."""
    if len(data) < 24:
        return
    magic = data[:4]
    endian = "<" if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    i = 24
    while i + 16 <= len(data):
        caplen = struct.unpack(endian + "I", data[i + 8:i + 12])[0]
        yield data[i + 16:i + 16 + caplen]
        i += 16 + caplen


def checksum(data):
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack(f">{len(data) // 2}H", data))
    while s > 0xFFFF:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ip(proto, payload, src=b"\x0a\x00\x00\x02", dst=b"\x0a\x00\x00\x01", ident=7, offset=0, more=False, total=None):
    """An IPv4 packet (the harnesses fix checksums again after mutation)."""
    flags = (0x2000 if more else 0) | (offset // 8)
    h = struct.pack(">BBHHHBBH4s4s", 0x45, 0, total or 20 + len(payload), ident, flags, 64, proto, 0, src, dst)
    return h[:10] + struct.pack(">H", checksum(h)) + h[12:] + payload


def tcp(sport, dport, seq, ack, flags, data=b"", options=b""):
    off = (20 + len(options)) // 4
    return struct.pack(">HHIIBBHHH", sport, dport, seq, ack, off << 4, flags, 65535, 0, 0) + options + data


def made_up_exchanges():
    """Packets from the terminal (10.0.0.2) to the stack (10.0.0.1) that reach deep states."""
    syn = ip(6, tcp(40000, 80, 1000, 0, 0x02, options=b"\x02\x04\x05\xb4\x04\x02\x08\x0a\x00\x00\x00\x01\x00\x00\x00\x00\x01\x03\x03\x07"))
    ack = ip(6, tcp(40000, 80, 1001, 0, 0x10))
    data = ip(6, tcp(40000, 80, 1001, 0, 0x18, b"GET / HTTP/1.0\r\n\r\n"))
    fin = ip(6, tcp(40000, 80, 1019, 0, 0x11))
    udp = struct.pack(">HHHH", 5353, 53, 8 + 12, 0) + b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    frag_payload = struct.pack(">HHHH", 5353, 53, 8 + 40, 0) + bytes(range(40))
    fragments = [ip(17, frag_payload[32:], ident=99, offset=32),
                 ip(17, frag_payload[:16], ident=99, offset=0, more=True),
                 ip(17, frag_payload[16:32], ident=99, offset=16, more=True)]
    echo = ip(1, b"\x08\x00\x00\x00\x12\x34\x00\x01" + bytes(32))
    return [[syn, ack, data, fin], [syn, ack, data, data, fin, ack], fragments, [ip(17, udp), echo], fragments + [syn, ack, data]]


def lcp(code, ident, options=b"", proto=0xC021):
    body = struct.pack(">BBH", code, ident, 4 + len(options)) + options
    return struct.pack(">H", proto) + body


def link_sessions():
    """Whole sessions from the terminal's side: LCP, authentication, IPCP, then IP."""
    frames = lambda fs: b"".join(len(f).to_bytes(2, "big") + f for f in fs)
    lcp_req = lcp(1, 1, b"\x01\x04\x05\xdc\x02\x06\x00\x00\x00\x00\x05\x06\x12\x34\x56\x78\x07\x02\x08\x02")
    lcp_ack = lcp(2, 1)  # the harness fills in our request's options
    ipcp_req = lcp(1, 1, b"\x03\x06\x0a\x00\x00\x02\x02\x06\x00\x2d\x0f\x01", proto=0x8021)
    ipcp_ack = lcp(2, 1, proto=0x8021)
    pap = struct.pack(">H", 0xC023) + struct.pack(">BBHB", 1, 1, 4 + 1 + 8 + 1 + 6, 8) + b"terminal" + b"\x06secret"
    echo = lcp(9, 2, b"\x12\x34\x56\x78hello")
    ip_frames = [struct.pack(">H", 0x0021) + p for ex in made_up_exchanges() for p in ex]
    sessions = [
        b"\x02" + frames([lcp_req, lcp_ack, ipcp_req, ipcp_ack, echo] + ip_frames),
        b"\x06" + frames([lcp_req, lcp_ack, pap, ipcp_req, ipcp_ack] + ip_frames[:6]),
        b"\x0a" + frames([lcp_req, lcp_ack, ipcp_req, ipcp_ack]),
        b"\x02" + frames([lcp_req, lcp_ack, lcp(5, 3, b"bye"), lcp(1, 4), ipcp_req]),
    ]
    return sessions


def socks_handshakes():
    """SOCKS4, 4a and 5 handshakes (with and without a password) for the proxy's parser."""
    return [
        b"\x04\x01\x01\xbb\x7f\x00\x00\x01user\x00data",
        b"\x04\x01\x00\x50\x00\x00\x00\x01\x00example.test\x00",
        b"\x05\x01\x00\x05\x01\x00\x01\x7f\x00\x00\x01\x17\x70hello",
        b"\x05\x01\x00\x05\x01\x00\x03\x0cexample.test\x01\xbb",
        b"\x05\x01\x00\x05\x01\x00\x04" + bytes(range(16)) + b"\x00\x50",
        b"\x05\x02\x00\x02\x01\x04user\x06secret\x05\x01\x00\x01\x0a\x00\x00\x01\x00\x35",
        b"\x05\x01\x00\x05\x03\x00\x01\x00\x00\x00\x00\x00\x00",
    ]


def main():
    target, traces, out = sys.argv[1:4]
    count = 0
    for name in sorted(os.listdir(traces)):
        path = os.path.join(traces, name)
        data = open(path, "rb").read()
        if target == "stream" and name.endswith(".pppd"):
            for k, stream in enumerate(record_streams(data)):
                for settings in (b"\x00\x00\xbb\x10", b"\x00\xff\xbb\x07"):
                    # Long streams are cut into pieces so each seed runs fast.
                    for start in range(0, len(stream), 512):
                        open(os.path.join(out, f"{name}-{k}-{settings.hex()}-{start}"), "wb").write(settings + stream[start:start + 512])
                        count += 1
        elif target == "packets" and name.endswith(".pcap"):
            for n, record in enumerate(pcap_records(data)):
                for selector in range(4):  # the packet parsers; 4 is SOCKS (seeded below)
                    open(os.path.join(out, f"{name}-{n}-{selector}"), "wb").write(bytes([selector]) + record[:2048])
                    count += 1
        elif target == "stack" and name.endswith(".pcap"):
            # The IPv4 packets of each capture, as one input of length-prefixed packets.
            packets = []
            for record in pcap_records(data):
                at = record.find(b"\x45")
                if at >= 0:
                    p = record[at:at + 1500]
                    packets.append(len(p).to_bytes(2, "big") + p)
            for start in range(0, len(packets), 8):
                for flags in (b"\x00", b"\x02"):
                    open(os.path.join(out, f"{name}-{start}-{flags.hex()}"), "wb").write(flags + b"".join(packets[start:start + 8]))
                    count += 1
    if target == "stack":
        for n, exchange in enumerate(made_up_exchanges()):
            open(os.path.join(out, f"made-up-{n}"), "wb").write(b"\x02" + b"".join(len(p).to_bytes(2, "big") + p for p in exchange))
            count += 1
    if target == "replay":
        for name in sorted(os.listdir(traces)):
            if not name.endswith(".pppd"):
                continue
            data = open(os.path.join(traces, name), "rb").read()
            open(os.path.join(out, f"{name}-record"), "wb").write(data[:16384])
            session = b"".join(bytes([(0x80 if rcvd else 0) | t]) + len(f).to_bytes(2, "big") + f for rcvd, t, f in record_frames(data))
            for flags in (0, 1, 2):
                open(os.path.join(out, f"{name}-frames-{flags}"), "wb").write(bytes([flags]) + session[:16383])
                count += 1
    if target == "link":
        for n, session in enumerate(link_sessions()):
            open(os.path.join(out, f"session-{n}"), "wb").write(session)
            count += 1
    if target == "channel":
        for n, h in enumerate(socks_handshakes()):
            for selector in (0, 2):
                open(os.path.join(out, f"socks-{n}-{selector}"), "wb").write(bytes([selector]) + h)
                count += 1
        op = lambda kind, data: bytes([kind]) + len(data).to_bytes(2, "big") + data
        query = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x07example\x04test\x00\x00\x01\x00\x01"
        answer = query[:2] + b"\x81\x80" + query[4:]
        sequences = [
            op(0, query) + op(1, answer) + op(2, b"x" * 120),
            op(0, query) + op(0, query) + op(5, answer) + op(3, b"") + op(2, b"x" * 40) + op(1, answer),
            b"".join(op(0, query) for _ in range(10)) + op(2, b"x" * 200),
            op(0, b"short") + op(1, b"\x00" * 12),
        ]
        for n, seq in enumerate(sequences):
            open(os.path.join(out, f"dns-{n}"), "wb").write(b"\x01" + seq)
            count += 1
    if target == "packets":
        # SOCKS handshakes for the proxy's parser (selector 4; selector 9, bit 3 set, adds a password).
        handshakes = socks_handshakes()
        for n, h in enumerate(handshakes):
            for selector in (4, 9):
                open(os.path.join(out, f"socks-{n}-{selector}"), "wb").write(bytes([selector]) + h)
                count += 1
    if target == "messages":
        header = lambda cat, typ, cls="Service", ident='"ServiceID":"2",': (
            '{"ProtocolVersion":"3.1","MessageClass":"%s","MessageCategory":"%s","MessageType":"%s",%s'
            '"SaleID":"HOST-1","POIID":"SIM-00000001"}' % (cls, cat, typ, ident))
        bodies = [
            ("SaleToPOIRequest", header("Login", "Request"), "LoginRequest",
             '{"DateTime":"2026-11-01T10:00:00Z","OperatorLanguage":"es","Ext":{"LocationID":"tml_test_1","Environment":"int"}}'),
            ("SaleToPOIRequest", header("Payment", "Request"), "PaymentRequest",
             '{"SaleData":{"SaleTransactionID":{"TransactionID":"0001ABC","TimeStamp":"2026-11-01T10:00:05Z"}},'
             '"PaymentTransaction":{"AmountsReq":{"Currency":"EUR","CurrencyNumeric":"978","RequestedAmountMinor":1050}},'
             '"PaymentData":{"PaymentType":"Normal"},"Ext":{"Route":"TerminalDirect","OriginalOperationID":null}}'),
            ("SaleToPOIResponse", header("Payment", "Response"), "PaymentResponse",
             '{"Response":{"Result":"Failure","ErrorCondition":"InProgress","AdditionalResponse":"message=Uncompleted%20transaction"}}'),
            ("SaleToPOIRequest", header("Display", "Request", "Device", '"DeviceID":"5",'), "DisplayRequest",
             '{"DisplayOutput":[{"Device":"CashierDisplay","InfoQualify":"Status","OutputContent":{"OutputFormat":"Text","OutputText":[{"Text":"INSERT, SWIPE OR TAP \\u00e9"}]}}]}'),
            ("SaleToPOIRequest", header("Event", "Notification", "Event", ""), "EventNotification",
             '{"TimeStamp":"2026-11-01T10:00:00Z","EventToNotify":"ExtUpdateProgress","Ext":{"Progress":0.25}}'),
            ("SaleToPOIRequest", header("Abort", "Request"), "AbortRequest",
             '{"MessageReference":{"MessageCategory":"Payment","ServiceID":"2","SaleID":"HOST-1"},"AbortReason":"MerchantAbort"}'),
        ]
        frames = []
        for direction, head, name, body in bodies:
            payload = ('{"%s":{"MessageHeader":%s,"%s":%s}}' % (direction, head, name, body)).encode()
            frames.append(len(payload).to_bytes(4, "big") + payload)
        for n, frame in enumerate(frames):
            for stride in (0, 3, 31):
                open(os.path.join(out, f"message-{n}-{stride}"), "wb").write(bytes([stride]) + frame)
                count += 1
            open(os.path.join(out, f"json-{n}"), "wb").write(b"\x00" + frame[4:])
            count += 1
        open(os.path.join(out, "messages-all"), "wb").write(b"\x07" + b"".join(frames))
        count += 1
    if target == "remote":
        # What ser2net 4.3 sent on a real RFC 2217 port (its greeting, then the answers to our
        # settings), with PPP bytes, an escaped 0xFF, and a carrier seen and lost.
        iac = lambda *b: bytes([255, *b])
        sb = lambda code, value: iac(250, 44, code) + value.replace(b"\xff", b"\xff\xff") + iac(240)
        greeting = iac(251, 3) + iac(253, 3) + iac(251, 1) + iac(254, 1) + iac(253, 0) + iac(251, 0) + iac(253, 44)
        answers = sb(107, b"\x00") + sb(101, b"\x00\x00\x25\x80") + sb(102, b"\x08") + sb(103, b"\x01") + sb(104, b"\x01") + sb(105, b"\x01")
        ppp = b"\x7e\xff\xff\x03\xc0\x21\x01\x01\x00\x04\x7d\x23\x7e"
        sessions = [
            b"\x60" + greeting + answers + ppp,
            b"\x07" + greeting + sb(107, b"\x80") + ppp + sb(108, b"") + sb(109, b"") + sb(107, b"\x00"),
            b"\x21" + iac(254, 0) + iac(252, 0) + iac(253, 44) + b"A\r\x00B\r\n" + iac(241) + iac(246),
            b"\x02" + iac(250, 44, 101) + b"x" * 100 + iac(240) + ppp,
            b"\x10" + b"tcp:127.0.0.1:17501",
            b"\x11" + b"rfc2217:[::ffff:192.0.2.7]:7000",
        ]
        for n, session in enumerate(sessions):
            open(os.path.join(out, f"remote-{n}"), "wb").write(session)
            count += 1
    if target == "session":
        def rec(op, payload=b""):
            if isinstance(payload, str):
                payload = payload.encode()
            return bytes([op]) + len(payload).to_bytes(2, "big") + payload
        answer, event, device, frame, raw, time, pay, cancel, sign, admin, lose, fail, reply, control = 0, *range(2, 15)
        ok = '{"Response":{"Result":"Success"}'
        login = ok + ',"POISystemData":{"POITerminalData":{"POISerialNumber":"SIM-1"},"POISoftware":{"SoftwareVersion":"1.0.0"}},' \
            '"Ext":{"ReaderSession":"00112233445566778899aabbccddeeff","Battery":{"Level":0.8},"KeyProfile":{"TransactionsRemaining":100}}}'
        update = ok + ',"Ext":{"AvailableUpdate":{"Version":"1.1.0","Size":1000,"SHA256":"' + "ab" * 32 + '","Signature":"' + "cd" * 64 + \
            '","DurationEstimate":"lessThanOneMinute"}}}'
        approved = ok + ',"PaymentResult":{"PaymentAcquirerData":{"ApprovalCode":"123456"},"AmountsResp":{"AuthorizedAmountMinor":1050},' \
            '"PaymentInstrumentData":{"CardData":{"MaskedPan":"411111******1111"}}},"POIData":{"POITransactionID":{"TransactionID":"77"}},' \
            '"Ext":{"OperationID":"OP-0011223344556677","SignatureRequired":true,"AuthenticatedByPin":false}}'
        in_progress = '{"Response":{"Result":"Failure","ErrorCondition":"InProgress"}}'
        recovered = ok + ',"RepeatedMessageResponse":{"RepeatedResponseMessageBody":{"PaymentResponse":' + approved + '}}}'
        amount = (1050).to_bytes(5, "big")
        scripts = {
            "pay-sign-reverse": (0, [rec(answer, login), rec(pay, amount), rec(event, '{"EventToNotify":"ExtPhase","Ext":{"Phase":"Authorizing"}}'),
                                     rec(device, b"\x01" + b'{"PrintOutput":{"DocumentQualifier":"CustomerReceipt","OutputContent":{"OutputText":[{"Text":"OK"}]}}}'),
                                     rec(answer, approved), rec(sign, b"\x00GIF"), rec(reply, '{"Result":"ok"}'), rec(sign, b"\x02"),
                                     rec(answer, ok + "}")]),
            "drop-and-recover": (0, [rec(answer, login), rec(pay, amount), rec(lose, b"\x01"), rec(time, b"\x00\x0a"), rec(answer, login),
                                     rec(answer, in_progress), rec(time, b"\x00\x40"), rec(answer, recovered)]),
            "relay": (0, [rec(answer, login), rec(pay, amount),
                          rec(device, b"\x02" + b'{"Message":"eyJUeXBlIjoiQXV0aG9yaXNlIiwiS1NOIjoiMDEiLCJBbW91bnRNaW5vciI6MTA1MH0=","MaximumTransmitTime":5}'),
                          rec(reply, b"\x00" + b'{"Type":"AuthoriseResult","Result":"ok"}'), rec(cancel), rec(answer, '{"Response":{"Result":"Failure","ErrorCondition":"Aborted"}}')]),
            "update": (0, [rec(answer, update), rec(admin, b"\x02"), rec(answer, ok + "}"), rec(event, '{"EventToNotify":"ExtUpdateProgress","Ext":{"Progress":0.5}}'),
                           rec(event, '{"EventToNotify":"EndMaintenance","EventDetails":"result=ok&version=1.1.0"}'),
                           rec(event, '{"EventToNotify":"Shutdown","EventDetails":"reason=updateRestart"}'), rec(lose), rec(time, b"\x00\x10"),
                           rec(answer, login.replace("1.0.0", "1.1.0"))]),
            "pairing": (1, [rec(answer, ok + ',"Ext":{"Pairing":{"TerminalPublicKey":"' + "11" * 32 + '","TerminalNonce":"' + "22" * 16 + '"}}}'),
                            rec(answer, ok + "}"), rec(answer, ok + "}"), rec(lose), rec(time, b"\x00\x10"), rec(answer, login)]),
            "bond-reboot": (2 | 1, [rec(answer, login), rec(admin, b"\x00"), rec(event, '{"EventToNotify":"Shutdown","EventDetails":"reason=rebootRequested"}'),
                                    rec(lose), rec(admin, b"\x01"), rec(control, b"\x00")]),
        }
        for name, (scene, records) in scripts.items():
            open(os.path.join(out, f"session-{name}"), "wb").write(bytes([scene]) + b"".join(records))
            count += 1
    if count == 0:
        sys.exit(f"no seeds written from {traces}")


if __name__ == "__main__":
    main()
