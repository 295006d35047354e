#!/usr/bin/env python3
"""`pppbridge serve` under hostile local clients: a measurement program, not a test.

Each subcommand starts `serve` on a configuration directory of its own, with simulated terminals
(our stack in the terminal role, `pppbridge run --pty --link PATH --role terminal --services
echo`, as Tools/serve-scale.py does), does something a hostile or careless local program could do,
and measures whether serve still answers and keeps its links up.

    Tools/serve-hostile.py [--binary .build/release/pppbridge] SUBCOMMAND [options]

    flood --kind control|bridge|metrics [--terminals 16] [--seconds 60]
        control: a client writes 64 KiB blocks of b"\\n" into the control socket as fast as it
        can, never reading; bridge: a client writes 64 KiB blocks into one terminal's bridge
        (the terminal's echo) as fast as it can and drains the replies; metrics: 8 threads GET
        /metrics in a loop plus a slowloris (one byte a second). Meanwhile `ctl list` is timed
        every 0.5 s and `ctl events` counts `closed` events. Goal: no closed event, all open at
        the end, every `ctl list` answered, the worst under 0.5 s.
    nofile [--clients 100]
        serve under `prlimit --nofile=64:64` with terminals a (bridge host:PORT) and b (holdoff
        1); 100 clients held on a's bridge; b's simulator killed and started again on the same
        link. Goal: b open again within 10 s + its holdoff, `ctl list` answered.
    idle-control [--connections 40]
        40 connections to the control socket that send nothing; 15 s later `ctl list` is timed.
        Goal: answered ok in under 2 s.
    secrets
        evil.conf, a symbolic link in the config directory to a file holding a secret, and a
        terminal whose `pcap` names an existing 0600 non-capture file. Goal: the secret is in
        neither serve's log, the events nor `ctl list`; the file is unchanged.
    hotplug [--terminals 64] [--seconds 3]
        create/unlink pairs of unrelated names, as fast as possible, in the one directory that
        holds every terminal's link, and serve's CPU against an equal quiet period. Goal: every
        terminal still open, serve under a quarter of a core during the churn.

Traffic stays on ptys, Unix sockets and 127.0.0.1 (a `bridge host:PORT` listens on every
interface; only loopback is used). Children and temporary directories are removed at the end.
Each subcommand prints `RESULT serve-hostile SUBCOMMAND key=value ...` as its last line and
exits 0 when its goal held, 1 when not.
"""
import argparse
import hashlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return next((int(l.split()[1]) for l in f if l.startswith("VmRSS:")), 0)


def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


class Serve:
    """A serve process, its terminals' simulators and their temporary directory."""

    def __init__(self, binary):
        self.binary = binary
        self.work = tempfile.mkdtemp(prefix="pppbridge-hostile-")
        os.chmod(self.work, 0o700)
        self.conf, self.lines = os.path.join(self.work, "conf"), os.path.join(self.work, "lines")
        os.makedirs(self.conf)
        os.makedirs(self.lines)
        self.control = os.path.join(self.work, "control")
        self.log = os.path.join(self.work, "serve.log")
        self.metrics_port = free_port()
        self.children, self.sims, self.events, self.proc = [], {}, [], None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for c in reversed(self.children):
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        for c in self.children:
            try:
                c.wait(10)
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait(5)
        shutil.rmtree(self.work, ignore_errors=True)

    def start(self, prefix=()):
        self.proc = subprocess.Popen([*prefix, self.binary, "serve", "--config", self.conf, "--control", self.control,
                                      "--metrics", f"127.0.0.1:{self.metrics_port}"],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.children.append(self.proc)
        deadline = time.time() + 20
        while not os.path.exists(self.control) and time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        if not os.path.exists(self.control):
            raise RuntimeError(f"serve did not make its control socket: {self.log_text()[-2000:]}")

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def simulator(self, name, services="echo", link=None):
        """Starts (or restarts) a terminal simulator whose pty is linked at lines/NAME."""
        link = link or os.path.join(self.lines, name)
        made = os.lstat(link).st_ctime_ns if os.path.lexists(link) else None
        p = subprocess.Popen([self.binary, "run", "--pty", "--link", link, "--role", "terminal", "--services", services],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.children.append(p)
        self.sims[name] = p
        deadline = time.time() + 20
        while time.time() < deadline and p.poll() is None:
            if os.path.lexists(link) and os.lstat(link).st_ctime_ns != made:
                return link
            time.sleep(0.01)
        raise RuntimeError(f"terminal simulator {name} made no link")

    def write_conf(self, name, *lines):
        tmp = os.path.join(self.conf, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write("".join(l + "\n" for l in lines))
        os.rename(tmp, os.path.join(self.conf, f"{name}.conf"))

    def terminal(self, name, *extra, services="echo", link=None):
        link = self.simulator(name, services, link)
        self.write_conf(name, f"device {link}", "lcp-echo-interval 1", "lcp-echo-failure 3", *extra)

    def ctl(self, *words, timeout=10):
        """(reply or None, seconds, raw output) of one `pppbridge ctl` run."""
        t0 = time.monotonic()
        try:
            out = subprocess.run([self.binary, "ctl", "--control", self.control, *words],
                                 capture_output=True, text=True, timeout=timeout)
            raw = out.stdout + out.stderr
            reply = json.loads(out.stdout.splitlines()[0]) if out.returncode == 0 and out.stdout else None
        except (subprocess.TimeoutExpired, ValueError) as e:
            reply, raw = None, str(e)
        return reply, time.monotonic() - t0, raw

    def raw_list(self):
        """Seconds for one list request on our own connection to the control socket (no ctl
        process to start), or None when it is not answered within 5 s."""
        t0 = time.monotonic()
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(5)
                s.connect(self.control)
                s.sendall(b'{"cmd":"list"}\n')
                data = b""
                while b"\n" not in data and time.monotonic() - t0 < 5:
                    chunk = s.recv(65536)
                    if not chunk:
                        return None
                    data += chunk
            return time.monotonic() - t0 if b'"ok":true' in data else None
        except OSError:
            return None

    def states(self):
        reply, _, _ = self.ctl("list")
        return {t["name"]: t["state"] for t in (reply or {}).get("terminals", [])}

    def wait_open(self, names, seconds=120):
        t0, deadline, states = time.time(), time.time() + seconds, {}
        while time.time() < deadline:
            states = self.states()
            if all(states.get(n) == "open" for n in names):
                break
            time.sleep(0.3)
        opened = sum(1 for n in names if states.get(n) == "open")
        print(f"ctl list: {opened} of {len(names)} terminals open after {time.time() - t0:.1f} s")
        return opened == len(names)

    def subscribe(self):
        """`ctl events` in a subprocess; its lines go to self.events as (monotonic time, dict or text)."""
        p = subprocess.Popen([self.binary, "ctl", "--control", self.control, "--timeout", "10", "events"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.children.append(p)

        def reader():
            for line in p.stdout:
                try:
                    self.events.append((time.monotonic(), json.loads(line)))
                except ValueError:
                    self.events.append((time.monotonic(), line.rstrip("\n")))
        threading.Thread(target=reader, daemon=True).start()

    def event_for(self, kind, terminal, since):
        return next((e for t, e in self.events if t >= since and isinstance(e, dict)
                     and e.get("event") == kind and e.get("terminal") == terminal), None)

    def closed_events(self, since):
        return [e for t, e in self.events if t >= since and isinstance(e, dict) and e.get("event") == "closed"]

    def metrics(self):
        with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            data, deadline = b"", time.time() + 10
            while time.time() < deadline:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data.decode(errors="replace")


def result(name, ok, **keys):
    print(f"RESULT serve-hostile {name} " + " ".join(f"{k}={v}" for k, v in keys.items()))
    return 0 if ok else 1


def bump(stats, key, n=1):
    stats[key] = stats.get(key, 0) + n


# Flood clients: each runs until `stop` is set or its deadline passes, and counts into `stats`.

def flood_stream(connect, drain, stop, deadline, stats):
    """Writes 64 KiB blocks as fast as the socket takes them (reading and discarding replies when
    `drain`), connecting again whenever the server lets it go."""
    block, sock = (b"\xa5" if drain else b"\n") * 65536, None
    while not stop.is_set() and time.time() < deadline:
        try:
            if sock is None:
                sock = connect()
                sock.setblocking(False)
                bump(stats, "connections")
            readable, writable, _ = select.select([sock] if drain else [], [sock], [], 0.1)
            if readable:
                data = sock.recv(262144)
                if not data:
                    raise ConnectionResetError("closed")
                bump(stats, "received", len(data))
            if writable:
                bump(stats, "sent", sock.send(block))
        except BlockingIOError:
            pass
        except OSError:
            bump(stats, "let_go")
            sock = sock.close() if sock else None
            time.sleep(0.01)
    sock.close() if sock else None


def flood_metrics_get(port, stop, deadline, stats, lock):
    while not stop.is_set() and time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                data = b""
                while len(data) < 1 << 22:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            key = "get_ok" if data.startswith(b"HTTP/1.") and b" 200 " in data[:20] else "get_bad"
        except OSError:
            key = "get_failed"
            time.sleep(0.01)
        with lock:
            bump(stats, key)


def slowloris(port, stop, deadline, stats):
    text = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 10000
    while not stop.is_set() and time.time() < deadline:
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                bump(stats, "slow_connections")
                for byte in text[:int(deadline - time.time()) + 2]:
                    s.sendall(bytes([byte]))
                    if stop.wait(1.0):
                        return
                    if select.select([s], [], [], 0)[0] and not s.recv(4096):
                        raise ConnectionResetError("closed")
        except OSError:
            bump(stats, "slow_let_go")
            stats["slow_held_s"] = round(time.monotonic() - t0)
            time.sleep(0.1)


def cmd_flood(args, srv):
    names = [f"t{n:02d}" for n in range(args.terminals)]
    ports = {n: free_port() for n in names} if args.kind == "bridge" else {}
    srv.start()
    srv.subscribe()
    for n in names:
        if args.kind == "bridge":
            srv.terminal(n, f"bridge host:{ports[n]}", services=f"echo:{ports[n]}")
        else:
            srv.terminal(n)
    all_open = srv.wait_open(names)
    stop, stats, lock, threads = threading.Event(), {}, threading.Lock(), []
    t_start, deadline = time.monotonic(), time.time() + args.seconds
    if args.kind == "control":
        connect = lambda: (lambda s: (s.connect(srv.control), s)[1])(socket.socket(socket.AF_UNIX))
        threads.append(threading.Thread(target=flood_stream, args=(connect, False, stop, deadline, stats)))
    elif args.kind == "bridge":
        connect = lambda: socket.create_connection(("127.0.0.1", ports[names[0]]), timeout=5)
        threads.append(threading.Thread(target=flood_stream, args=(connect, True, stop, deadline, stats)))
    else:
        threads += [threading.Thread(target=flood_metrics_get, args=(srv.metrics_port, stop, deadline, stats, lock))
                    for _ in range(8)]
        threads.append(threading.Thread(target=slowloris, args=(srv.metrics_port, stop, deadline, stats)))
    raw = []  # list on our own socket beside ctl's: the loop's latency without a process to start
    threads.append(threading.Thread(target=lambda: [raw.append(srv.raw_list()) for _ in range(4 * args.seconds)
                                                    if not stop.wait(0.5) and time.time() < deadline]))
    for t in threads:
        t.daemon = True
        t.start()
    print(f"flood {args.kind}: {len(threads) - 1} client thread(s) for {args.seconds} s; ctl list every 0.5 s")
    latencies, failures, not_open_seen, rss_peak, tick = [], [], 0, 0, time.monotonic()
    cpu0 = cpu_seconds(srv.proc.pid)
    try:
        while time.time() < deadline and srv.proc.poll() is None:
            reply, seconds, out = srv.ctl("list")
            latencies.append(seconds)
            if reply is None or not reply.get("ok"):
                failures.append(out.strip()[:200])
            else:
                not_open_seen += sum(1 for t in reply["terminals"] if t["state"] != "open")
            rss_peak = max(rss_peak, rss_kib(srv.proc.pid))
            tick += 0.5
            time.sleep(max(0.0, min(tick - time.monotonic(), deadline - time.time())))
        cpu = cpu_seconds(srv.proc.pid) - cpu0
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    time.sleep(1)
    final = srv.states()
    open_at_end = sum(1 for n in names if final.get(n) == "open")
    closed = srv.closed_events(t_start)
    worst, p50 = 1000 * max(latencies, default=0), 1000 * percentile(latencies, 0.5)
    answered = [r for r in raw if r is not None]
    print(f"flood clients: {json.dumps(stats, sort_keys=True)}")
    print(f"ctl list: {len(latencies)} calls, {len(failures)} failed, worst {worst:.0f} ms, p50 {p50:.0f} ms, "
          f"p90 {1000 * percentile(latencies, 0.9):.0f} ms; terminals not open across the polls: {not_open_seen}")
    print(f"list on our own socket (no ctl process): {len(raw) - len(answered)} unanswered, "
          f"worst {1000 * max(answered, default=0):.0f} ms, p50 {1000 * percentile(answered, 0.5):.0f} ms")
    for f in failures[:5]:
        print(f"  failed: {f}")
    print(f"serve: {cpu:.1f} s of CPU during the flood ({100 * cpu / args.seconds:.0f}% of a core), RSS peak {rss_peak} KiB, "
          f"{'running' if srv.proc.poll() is None else f'exited {srv.proc.returncode}'}")
    print(f"closed events during the flood: {len(closed)}; terminals not open at the end: {len(names) - open_at_end}")
    for e in closed[:5]:
        print(f"  {json.dumps(e)}")
    ok = all_open and not closed and open_at_end == len(names) and not failures and worst < 500
    return result("flood", ok, kind=args.kind, terminals=args.terminals, seconds=args.seconds, ctl_calls=len(latencies),
                  ctl_failures=len(failures), ctl_worst_ms=f"{worst:.0f}", ctl_p50_ms=f"{p50:.0f}",
                  closed_events=len(closed), open_at_end=open_at_end)


def cmd_nofile(args, srv):
    port = free_port()
    srv.start(prefix=("prlimit", "--nofile=64:64", "--"))
    srv.subscribe()
    srv.terminal("a", f"bridge host:{port}", services=f"echo:{port}")
    srv.terminal("b", "holdoff 1")
    srv.wait_open(["a", "b"], 60)
    clients, refused = [], 0
    for _ in range(args.clients):
        try:
            clients.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            refused += 1
    time.sleep(2)
    held = 0
    for c in clients:
        c.setblocking(False)
        try:
            held += 1 if c.recv(1) else 0  # the echo sends nothing unasked: data means something odd
        except BlockingIOError:
            held += 1
        except OSError:
            pass
    print(f"clients on a's bridge: {len(clients)} connected, {refused} refused at connect, {held} still connected after 2 s")
    try:
        t_kill = time.monotonic()
        srv.sims["b"].kill()
        srv.sims["b"].wait(5)
        while time.monotonic() - t_kill < 10 and not srv.event_for("closed", "b", t_kill):
            time.sleep(0.05)
        print(f"b: simulator killed; serve's closed event after {time.monotonic() - t_kill:.1f} s: "
              f"{json.dumps(srv.event_for('closed', 'b', t_kill))}")
        srv.simulator("b")
        t_new, b_reopen, ctl_worst = time.monotonic(), None, 0.0
        while time.monotonic() - t_new < 30:
            reply, seconds, _ = srv.ctl("list")
            ctl_worst = max(ctl_worst, seconds)
            states = {t["name"]: t["state"] for t in (reply or {}).get("terminals", [])}
            if states.get("b") == "open" and srv.event_for("opened", "b", t_new):
                b_reopen = time.monotonic() - t_new
                break
            time.sleep(0.2)
        print(f"b: a new simulator on the same link; "
              + (f"open again {b_reopen:.1f} s after it made its link" if b_reopen is not None else "not open within 30 s"))
        reply, seconds, raw = srv.ctl("list")
        ctl_worst = max(ctl_worst, seconds)
        print(f"ctl list: {'ok' if reply and reply.get('ok') else 'FAILED ' + raw.strip()[:200]} in {1000 * seconds:.0f} ms;"
              f" worst {1000 * ctl_worst:.0f} ms; states {[(t['name'], t['state']) for t in (reply or {}).get('terminals', [])]}")
        try:
            for line in srv.metrics().splitlines():
                if line.startswith(("pppbridge_descriptors", "pppbridge_host_descriptors", "pppbridge_terminal_host_descriptors")):
                    print(f"  {line}")
        except OSError as e:
            print(f"metrics: could not be fetched ({e})")
    finally:
        for c in clients:
            c.close()
    ok = b_reopen is not None and b_reopen < 11 and reply is not None and reply.get("ok")
    return result("nofile", ok, clients=args.clients, held=held,
                  b_reopen_s=f"{b_reopen:.1f}" if b_reopen is not None else "none", ctl_ms=f"{1000 * ctl_worst:.0f}")


def cmd_idle_control(args, srv):
    srv.start()
    srv.terminal("t0")
    srv.wait_open(["t0"], 60)
    conns = []
    try:
        for _ in range(args.connections):
            s = socket.socket(socket.AF_UNIX)
            s.connect(srv.control)
            s.setblocking(False)
            conns.append(s)
        print(f"{len(conns)} idle connections to the control socket; watching them for 15 s")
        t0, closed_at, greeted = time.monotonic(), {}, 0
        while time.monotonic() - t0 < 15:
            for s in select.select([s for s in conns if s not in closed_at], [], [], 0.2)[0]:
                try:
                    data = s.recv(65536)
                    greeted += 1 if data else 0
                    if not data:
                        closed_at[s] = time.monotonic() - t0
                except BlockingIOError:
                    pass
                except OSError:
                    closed_at[s] = time.monotonic() - t0
        closed, times = len(closed_at), sorted(closed_at.values())
        print(f"closed by the server: {closed} of {len(conns)} ({greeted} reads with data)"
              + (f", after {times[0]:.1f} to {times[-1]:.1f} s" if times else ""))
        reply, seconds, raw = srv.ctl("list")
        answered = bool(reply and reply.get("ok"))
        print(f"ctl list: {'ok' if answered else 'FAILED: ' + raw.strip()[:300]} in {1000 * seconds:.0f} ms")
    finally:
        for s in conns:
            s.close()
    return result("idle-control", answered and seconds < 2, connections=args.connections,
                  closed_by_server=closed, ctl_ms=f"{1000 * seconds:.0f}")


def cmd_secrets(args, srv):
    secret = "SECRET-" + os.urandom(16).hex()
    outside = os.path.join(srv.work, "outside")
    os.makedirs(outside)
    secret_file, accounts = os.path.join(outside, "db.env"), os.path.join(outside, "accounts.db")
    with open(secret_file, "w") as f:
        f.write(f"db_password={secret}\n")
    with open(os.open(accounts, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(4096))
    digest = lambda: hashlib.sha256(open(accounts, "rb").read()).hexdigest()
    before = digest()
    srv.start()
    srv.subscribe()
    srv.terminal("good")
    srv.wait_open(["good"], 60)
    os.symlink(secret_file, os.path.join(srv.conf, "evil.conf"))
    t_added = time.monotonic()
    srv.terminal("pcapper", f"pcap {accounts}")
    while time.monotonic() - t_added < 20 and not srv.event_for("opened", "pcapper", t_added) \
            and not srv.event_for("closed", "pcapper", t_added):
        time.sleep(0.1)
    time.sleep(3)
    srv.ctl("reload")
    time.sleep(1)
    listed = srv.ctl("list")[2]
    log, events = srv.log_text(), "\n".join(e if isinstance(e, str) else json.dumps(e) for _, e in srv.events)
    after = digest()
    seen = [where for where, text in (("log", log), ("events", events), ("list", listed)) if secret in text]
    print("serve's log and events on evil.conf and the pcap file (each distinct line once, with its count):")
    shown = [l for l in log.splitlines() if "evil.conf" in l or "accounts.db" in l or "pcapper" in l]
    shown += ["event: " + (e if isinstance(e, str) else json.dumps(e)) for _, e in srv.events if "evil" in str(e) or "accounts" in str(e)]
    for line in dict.fromkeys(shown):
        print(f"  {shown.count(line)}× {line}")
    print(f"secret seen in: {', '.join(seen) or 'nowhere'}; accounts.db sha256 {before[:16]}… → {after[:16]}…, "
          f"mode {oct(os.stat(accounts).st_mode & 0o777)}")
    return result("secrets", not seen and before == after, secret_seen=",".join(seen) or "no",
                  file_unchanged="yes" if before == after else "no")


def cmd_hotplug(args, srv):
    names = [f"t{n:02d}" for n in range(args.terminals)]
    srv.start()
    srv.subscribe()
    for n in names:
        srv.terminal(n)
    all_open = srv.wait_open(names, 180)
    time.sleep(2)
    pid = srv.proc.pid
    quiet0 = cpu_seconds(pid)
    time.sleep(args.seconds)
    quiet = cpu_seconds(pid) - quiet0
    t_start, pairs, c0 = time.monotonic(), 0, cpu_seconds(pid)
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline and pairs < 10_000_000:
        path = os.path.join(srv.lines, f"unrelated-{pairs % 1000}")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.unlink(path)
        pairs += 1
    busy = cpu_seconds(pid) - c0
    time.sleep(1)
    busy_after = cpu_seconds(pid) - c0
    final = srv.states()
    open_at_end = sum(1 for n in names if final.get(n) == "open")
    closed = srv.closed_events(t_start)
    print(f"quiet {args.seconds} s: serve used {quiet:.2f} s of CPU")
    print(f"churn {args.seconds} s: {pairs} create/unlink pairs ({pairs / args.seconds:.0f}/s) beside the links; "
          f"serve used {busy:.2f} s of CPU ({100 * busy / args.seconds:.0f}% of a core), {busy_after:.2f} s counting 1 s after")
    print(f"terminals open at the end: {open_at_end} of {len(names)}; closed events: {len(closed)}")
    ok = all_open and open_at_end == len(names) and not closed and busy < 0.25 * args.seconds
    return result("hotplug", ok, terminals=args.terminals, pairs=pairs, cpu_s=f"{busy:.2f}", quiet_cpu_s=f"{quiet:.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=".build/release/pppbridge")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("flood")
    p.add_argument("--kind", choices=["control", "bridge", "metrics"], required=True)
    p.add_argument("--terminals", type=int, default=16)
    p.add_argument("--seconds", type=int, default=60)
    sub.add_parser("nofile").add_argument("--clients", type=int, default=100)
    sub.add_parser("idle-control").add_argument("--connections", type=int, default=40)
    sub.add_parser("secrets")
    p = sub.add_parser("hotplug")
    p.add_argument("--terminals", type=int, default=64)
    p.add_argument("--seconds", type=int, default=3)
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    if not os.access(binary, os.X_OK):
        sys.exit(f"no binary at {binary}")
    run = {"flood": cmd_flood, "nofile": cmd_nofile, "idle-control": cmd_idle_control,
           "secrets": cmd_secrets, "hotplug": cmd_hotplug}[args.command]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so the finally blocks run
    with Serve(binary) as srv:
        try:
            return run(args, srv)
        except (RuntimeError, OSError) as e:
            print(f"error: {e}")
            return result(args.command, False, error=type(e).__name__)


if __name__ == "__main__":
    sys.exit(main())
