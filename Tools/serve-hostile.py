#!/usr/bin/env python3
"""`pppbridge serve` under hostile local clients: a measurement program, not a test.

Each subcommand starts `serve` (--control, --metrics) on a directory of its own with simulated
terminals (`pppbridge run --pty --link PATH --role terminal --services echo`, as serve-scale.py),
does what a hostile or careless local program could, and measures whether serve still answers.

    Tools/serve-hostile.py [--binary .build/release/pppbridge] SUBCOMMAND [options]

  flood --kind control|bridge|metrics [--terminals 16] [--seconds 60]
      64 KiB blocks of newlines into the control socket, never read (control); 64 KiB blocks into
      one terminal's bridge to its echo, replies drained (bridge); 8 threads of GET /metrics and
      a slowloris at a byte a second (metrics). `ctl list` timed every 0.5 s, `ctl events` watched.
      Goal: no closed event, all open at the end, every ctl list answered, the worst under 0.5 s.
  nofile [--clients 100]     serve under `prlimit --nofile=64:64`; clients held on terminal a's
      bridge while b's simulator (holdoff 1) is killed and started again on the same link.
      Goal: b open again within 10 s + its holdoff, ctl list answered.
  idle-control [--connections 40]   connections to the control socket that send nothing; ctl
      list timed 15 s later. Goal: answered ok in under 2 s.
  secrets     evil.conf, a symbolic link to a file holding a secret, in the config directory; a
      terminal whose `pcap` names an existing 0600 file that is no capture. Goal: the secret is in
      neither serve's log, the events nor ctl list; the file is unchanged.
  hotplug [--terminals 64] [--seconds 3]   create/unlink pairs of unrelated names, as fast as we
      can, in the directory of every terminal's link; serve's CPU then and in an equal quiet
      period before. Goal: all still open, ctl list answered, serve under a quarter of a core.

Traffic stays on ptys, Unix sockets and 127.0.0.1 (`bridge host:PORT` listens on every interface;
only loopback is used); children and temporary directories are removed at the end. The last line
is `RESULT serve-hostile SUBCOMMAND key=value ...`; exit status 0 when the goal held, else 1.
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

from proc_stats import cpu_seconds, rss_kib

GET = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]






def percentile(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else 0.0


def connected(address, seconds=5):
    """A socket connected to a Unix socket path or a (host, port)."""
    s, deadline = socket.socket(socket.AF_UNIX) if isinstance(address, str) else socket.socket(), time.time() + seconds
    s.settimeout(seconds)
    while True:
        try:
            s.connect(address)
            return s
        except BlockingIOError:  # a Unix socket's full backlog: EAGAIN, where a blocking connect would wait
            if time.time() > deadline:
                s.close()
                raise
            time.sleep(0.01)


def still_open(sock):
    """False once the peer has closed or reset `sock` (whatever it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while sock.recv(65536):
            pass
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False


def exchange(address, request, until=None, seconds=5):
    """Sends `request` on a new connection (a Unix socket path or a (host, port)) and reads until
    `until` arrives, the peer closes, 4 MiB or `seconds`; returns the bytes (OSError passes)."""
    t0, data = time.monotonic(), b""
    with connected(address, seconds) as s:
        s.sendall(request)
        while (until is None or until not in data) and len(data) < 1 << 22 and time.monotonic() - t0 < seconds:
            if not (chunk := s.recv(65536)):
                break
            data += chunk
    return data


def bump(stats, key, n=1):
    stats[key] = stats.get(key, 0) + n


def result(name, ok, **keys):
    print(f"RESULT serve-hostile {name} " + " ".join(f"{k}={v}" for k, v in keys.items()))
    return 0 if ok else 1


class Serve:
    """A serve process, its terminals' simulators, an events subscriber and their directory."""

    def __init__(self, binary):
        self.binary = binary
        self.work = tempfile.mkdtemp(prefix="pppbridge-hostile-")
        os.chmod(self.work, 0o700)
        self.conf, self.lines = os.path.join(self.work, "conf"), os.path.join(self.work, "lines")
        os.makedirs(self.conf)
        os.makedirs(self.lines)
        self.control, self.log = os.path.join(self.work, "control"), os.path.join(self.work, "serve.log")
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
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([*prefix, self.binary, "serve", "--config", self.conf, "--control", self.control,
                                          "--metrics", f"127.0.0.1:{self.metrics_port}"], stdout=log, stderr=subprocess.STDOUT)
        self.children.append(self.proc)
        deadline = time.time() + 20
        while not os.path.exists(self.control) and time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
        if not os.path.exists(self.control):
            raise RuntimeError(f"serve made no control socket: {self.log_text()[-2000:]}")

    def log_text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def simulator(self, name, services="echo"):
        """Starts (or starts again) a terminal simulator whose pty is linked at lines/NAME."""
        link = os.path.join(self.lines, name)
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

    def terminal(self, name, *extra, services="echo"):
        """A simulator, then its NAME.conf (written whole and renamed into place)."""
        link, tmp = self.simulator(name, services), os.path.join(self.conf, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write("".join(l + "\n" for l in (f"device {link}", "lcp-echo-interval 1", "lcp-echo-failure 3", *extra)))
        # serve refuses a configuration file its group or others may write (umask 002).
        os.chmod(tmp, 0o600)
        os.rename(tmp, os.path.join(self.conf, f"{name}.conf"))

    def ctl(self, *words, timeout=10):
        """(reply or None, seconds, output) of one `pppbridge ctl` process."""
        t0 = time.monotonic()
        try:
            out = subprocess.run([self.binary, "ctl", "--control", self.control, *words],
                                 capture_output=True, text=True, timeout=timeout)
            text = out.stdout + out.stderr
            reply = json.loads(out.stdout.splitlines()[0]) if out.returncode == 0 and out.stdout else None
        except (subprocess.TimeoutExpired, ValueError) as e:
            reply, text = None, str(e)
        return reply, time.monotonic() - t0, text

    def raw_list(self):
        """Seconds for a list request on our own control connection (no process started), or None."""
        t0 = time.monotonic()
        try:
            return time.monotonic() - t0 if b'"ok":true' in exchange(self.control, b'{"cmd":"list"}\n', b"\n") else None
        except OSError:
            return None

    def up(self, names, extra=lambda name: (), services=lambda name: "echo", seconds=120):
        """serve, `ctl events`, then the terminals; True when ctl list shows them all open."""
        self.start()
        self.subscribe()
        for n in names:
            self.terminal(n, *extra(n), services=services(n))
        return self.wait_open(names, seconds)

    def ending(self, names, since):
        """(how many of `names` ctl list shows open, closed events since `since`)."""
        final = self.states()
        return sum(1 for n in names if final.get(n) == "open"), self.events_of("closed", since)

    def states(self):
        return {t["name"]: t["state"] for t in (self.ctl("list")[0] or {}).get("terminals", [])}

    def wait_open(self, names, seconds=120):
        t0, states = time.time(), {}
        while time.time() < t0 + seconds:
            states = self.states()
            if all(states.get(n) == "open" for n in names):
                break
            time.sleep(0.3)
        opened = sum(1 for n in names if states.get(n) == "open")
        print(f"ctl list: {opened} of {len(names)} terminals open after {time.time() - t0:.1f} s")
        return opened == len(names)

    def subscribe(self):
        """`ctl events` in a process of its own; each line to self.events as (monotonic time, dict or text)."""
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

    def events_of(self, kind, since, terminal=None):
        return [e for t, e in self.events if t >= since and isinstance(e, dict) and e.get("event") == kind
                and terminal in (None, e.get("terminal"))]

    def print_metrics(self, *prefixes, only=""):
        try:
            data = exchange(("127.0.0.1", self.metrics_port), GET, seconds=10)
        except OSError as e:
            return print(f"metrics: not fetched ({e})")
        for line in data.decode(errors="replace").splitlines():
            if line.startswith(prefixes) and only in line:
                print(f"  {line}")


class Poller:
    """Times `ctl list` every 0.5 s, and beside it a list on our own socket (the loop's latency
    without a process to start), in threads, until `stop` or `deadline`."""

    def __init__(self, srv, stop, deadline):
        self.srv, self.stop, self.deadline = srv, stop, deadline
        self.ctl, self.raw, self.failures, self.not_open, self.rss_peak = [], [], [], 0, 0
        self.threads = [threading.Thread(target=self.every, args=(f,), daemon=True) for f in (self.poll_ctl, self.poll_raw)]
        for t in self.threads:
            t.start()

    def every(self, fn):
        tick = time.monotonic()
        for _ in range(int(2 * (self.deadline - time.time())) + 2):
            if self.stop.is_set() or time.time() >= self.deadline:
                return
            fn()
            tick += 0.5
            self.stop.wait(max(0.0, min(tick - time.monotonic(), self.deadline - time.time())))

    def poll_ctl(self):
        reply, seconds, text = self.srv.ctl("list")
        self.ctl.append(seconds)
        if reply is None or not reply.get("ok"):
            self.failures.append(text.strip()[:200])
        else:
            self.not_open += sum(1 for t in reply["terminals"] if t["state"] != "open")
        if self.srv.proc.poll() is None:
            self.rss_peak = max(self.rss_peak, rss_kib(self.srv.proc.pid))

    def poll_raw(self):
        self.raw.append(self.srv.raw_list())

    def report(self):
        for t in self.threads:
            t.join(15)
        worst, p50, answered = 1000 * max(self.ctl, default=0), 1000 * percentile(self.ctl, 0.5), [r for r in self.raw if r]
        print(f"ctl list: {len(self.ctl)} calls, {len(self.failures)} failed, worst {worst:.0f} ms, p50 {p50:.0f} ms, "
              f"p90 {1000 * percentile(self.ctl, 0.9):.0f} ms; terminals not open across the polls: {self.not_open}")
        print(f"list on our own socket: {len(self.raw)} requests, {len(self.raw) - len(answered)} unanswered, "
              f"worst {1000 * max(answered, default=0):.0f} ms, p50 {1000 * percentile(answered, 0.5):.0f} ms")
        for f in self.failures[:5]:
            print(f"  failed: {f}")
        return worst, p50


# Flood clients: each runs until `stop` is set or its deadline passes, counting into `stats`.

def flood_stream(address, drain, stop, deadline, stats):
    """64 KiB blocks as fast as the socket takes them (replies read and dropped when `drain`),
    connecting again whenever the server lets us go."""
    block, sock = (b"\xa5" if drain else b"\n") * 65536, None
    while not stop.is_set() and time.time() < deadline:
        try:
            if sock is None:
                sock = connected(address)
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
    if sock:
        sock.close()


def flood_metrics_get(port, stop, deadline, stats, lock):
    while not stop.is_set() and time.time() < deadline:
        try:
            data = exchange(("127.0.0.1", port), GET)
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
                    if select.select([s], [], [], 0)[0] and not still_open(s):
                        raise ConnectionResetError("closed")
        except OSError:
            bump(stats, "slow_let_go")
            stats["slow_held_s"] = round(time.monotonic() - t0)
            time.sleep(0.1)


def cmd_flood(args, srv):
    names = [f"t{n:02d}" for n in range(args.terminals)]
    ports = {n: free_port() for n in names}
    all_open = srv.up(names, lambda n: [f"bridge host:{ports[n]}"] * (args.kind == "bridge"), lambda n: f"echo:{ports[n]}")
    stop, stats, lock = threading.Event(), {}, threading.Lock()
    t_start, deadline = time.monotonic(), time.time() + args.seconds
    if args.kind != "metrics":
        address = srv.control if args.kind == "control" else ("127.0.0.1", ports[names[0]])
        threads = [threading.Thread(target=flood_stream, args=(address, args.kind == "bridge", stop, deadline, stats))]
    else:
        threads = [threading.Thread(target=flood_metrics_get, args=(srv.metrics_port, stop, deadline, stats, lock))
                   for _ in range(8)]
        threads.append(threading.Thread(target=slowloris, args=(srv.metrics_port, stop, deadline, stats)))
    for t in threads:
        t.daemon = True
        t.start()
    print(f"flood {args.kind}: {len(threads)} client thread(s) for {args.seconds} s; ctl list every 0.5 s")
    cpu0, poller = cpu_seconds(srv.proc.pid), Poller(srv, stop, deadline)
    try:
        while time.time() < deadline and srv.proc.poll() is None:
            stop.wait(min(1.0, max(0.0, deadline - time.time())))
        cpu = cpu_seconds(srv.proc.pid) - cpu0 if srv.proc.poll() is None else float("nan")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    worst, p50 = poller.report()
    time.sleep(1)
    open_at_end, closed = srv.ending(names, t_start)
    print(f"flood clients: {json.dumps(stats, sort_keys=True)}")
    print(f"serve: {cpu:.1f} s of CPU during the flood ({100 * cpu / args.seconds:.0f}% of a core), RSS peak "
          f"{poller.rss_peak} KiB, {'running' if srv.proc.poll() is None else f'exited {srv.proc.returncode}'}")
    if args.kind == "bridge":
        srv.print_metrics("pppbridge_bridge_", "pppbridge_line_frames_dropped", only='"t00"')
    else:
        srv.print_metrics(f"pppbridge_{args.kind}_clients")
    print(f"closed events during the flood: {len(closed)}; terminals not open at the end: {len(names) - open_at_end}")
    for e in closed[:5]:
        print(f"  {json.dumps(e)}")
    ok = all_open and not closed and open_at_end == len(names) and not poller.failures and worst < 500
    return result("flood", ok, kind=args.kind, terminals=args.terminals, seconds=args.seconds, ctl_calls=len(poller.ctl),
                  ctl_failures=len(poller.failures), ctl_worst_ms=f"{worst:.0f}", ctl_p50_ms=f"{p50:.0f}",
                  closed_events=len(closed), open_at_end=open_at_end)


def cmd_nofile(args, srv):
    port, clients, refused, b_reopen, ctl_worst, reply = free_port(), [], 0, None, 0.0, None
    srv.start(prefix=("prlimit", "--nofile=64:64", "--"))
    srv.subscribe()
    srv.terminal("a", f"bridge host:{port}", services=f"echo:{port}")
    srv.terminal("b", "holdoff 1")
    srv.wait_open(["a", "b"], 60)
    try:
        for _ in range(args.clients):
            try:
                clients.append(connected(("127.0.0.1", port), 2))
            except OSError:
                refused += 1
        time.sleep(2)
        held = sum(1 for c in clients if still_open(c))
        print(f"clients on a's bridge: {len(clients)} connected, {refused} refused at connect, {held} still connected after 2 s")
        t_kill = time.monotonic()
        srv.sims["b"].kill()
        srv.sims["b"].wait(5)
        while time.monotonic() - t_kill < 10 and not srv.events_of("closed", t_kill, "b"):
            time.sleep(0.05)
        print(f"b: simulator killed; after {time.monotonic() - t_kill:.2f} s serve said "
              f"{json.dumps((srv.events_of('closed', t_kill, 'b') or [None])[0])}; a new simulator on the same link")
        # Timed from before the new simulator starts: serve may open b before it returns.
        t_new = time.monotonic()
        srv.simulator("b")
        while time.monotonic() - t_new < 30:
            reply, seconds, _ = srv.ctl("list")
            ctl_worst = max(ctl_worst, seconds)
            if any(t["name"] == "b" and t["state"] == "open" for t in (reply or {}).get("terminals", [])) \
                    and srv.events_of("opened", t_new, "b"):
                b_reopen = time.monotonic() - t_new
                break
            time.sleep(0.1)
        print("b: " + (f"open again {b_reopen:.2f} s after its new link" if b_reopen is not None else "not open within 30 s"))
        reply, seconds, text = srv.ctl("list")
        ctl_worst = max(ctl_worst, seconds)
        print(f"ctl list: {'ok' if reply and reply.get('ok') else 'FAILED ' + text.strip()[:200]} in {1000 * seconds:.0f} ms,"
              f" worst {1000 * ctl_worst:.0f} ms; states {[(t['name'], t['state']) for t in (reply or {}).get('terminals', [])]}")
        srv.print_metrics("pppbridge_descriptors", "pppbridge_host_descriptors", "pppbridge_terminal_host_descriptors")
    finally:
        for c in clients:
            c.close()
    ok = b_reopen is not None and b_reopen < 11 and bool(reply and reply.get("ok"))
    return result("nofile", ok, clients=args.clients, held=held,
                  b_reopen_s=f"{b_reopen:.2f}" if b_reopen is not None else "none", ctl_ms=f"{1000 * ctl_worst:.0f}")


def cmd_idle_control(args, srv):
    srv.up(["t0"], seconds=60)
    conns, closed_at = [], {}
    try:
        conns = [connected(srv.control) for _ in range(args.connections)]
        print(f"{len(conns)} idle connections to the control socket; watching them for 15 s")
        t0 = time.monotonic()
        while time.monotonic() - t0 < 15:
            for s in select.select([s for s in conns if s not in closed_at], [], [], 0.2)[0]:
                if not still_open(s):
                    closed_at[s] = time.monotonic() - t0
        times = sorted(closed_at.values())
        print(f"closed by the server: {len(times)} of {len(conns)}"
              + (f"; at {', '.join(f'{t:.1f}' for t in sorted(set(round(t, 1) for t in times)))} s" if times else ""))
        reply, seconds, text = srv.ctl("list")
        answered = bool(reply and reply.get("ok"))
        print(f"ctl list: {'ok' if answered else 'FAILED: ' + text.strip()[:300]} in {1000 * seconds:.0f} ms")
        srv.print_metrics("pppbridge_control_clients")
    finally:
        for s in conns:
            s.close()
    return result("idle-control", answered and seconds < 2, connections=args.connections,
                  closed_by_server=len(times), ctl_ms=f"{1000 * seconds:.0f}")


def cmd_secrets(args, srv):
    secret, outside = "SECRET-" + os.urandom(16).hex(), os.path.join(srv.work, "outside")
    os.makedirs(outside)
    secret_file, accounts = os.path.join(outside, "db.env"), os.path.join(outside, "accounts.db")
    with open(secret_file, "w") as f:
        f.write(f"db_password={secret}\n")
    with open(os.open(accounts, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(os.urandom(4096))
    digest = lambda: hashlib.sha256(open(accounts, "rb").read()).hexdigest()
    before = digest()
    srv.up(["good"], seconds=60)
    os.symlink(secret_file, os.path.join(srv.conf, "evil.conf"))
    t_added = time.monotonic()
    srv.terminal("pcapper", f"pcap {accounts}")
    while time.monotonic() - t_added < 20 and not (srv.events_of("opened", t_added, "pcapper")
                                                   or srv.events_of("closed", t_added, "pcapper")):
        time.sleep(0.1)
    time.sleep(3)
    srv.ctl("reload")
    time.sleep(1)
    listed, log, after = srv.ctl("list")[2], srv.log_text(), digest()
    events = "\n".join(e if isinstance(e, str) else json.dumps(e) for _, e in srv.events)
    seen = [where for where, text in (("log", log), ("events", events), ("list", listed)) if secret in text]
    print("serve's log and events on evil.conf and the pcap file (each distinct line once, with its count):")
    shown = [l for l in log.splitlines() if "evil.conf" in l or "accounts.db" in l or "pcapper" in l]
    shown += ["event: " + l for l in events.splitlines() if "evil" in l or "accounts" in l]
    for line in dict.fromkeys(shown):
        print(f"  {shown.count(line)}x {line}")
    print(f"ctl list: {listed.strip()[:400]}")
    print(f"secret seen in: {', '.join(seen) or 'nowhere'}; accounts.db sha256 {before[:16]}... before, {after[:16]}... "
          f"after, mode {oct(os.stat(accounts).st_mode & 0o777)}")
    return result("secrets", not seen and before == after, secret_seen=",".join(seen) or "no",
                  file_unchanged="yes" if before == after else "no")


def cmd_hotplug(args, srv):
    names = [f"t{n:02d}" for n in range(args.terminals)]
    all_open = srv.up(names, seconds=180)
    time.sleep(2)
    pid = srv.proc.pid
    quiet0 = cpu_seconds(pid)
    time.sleep(args.seconds)
    quiet = cpu_seconds(pid) - quiet0
    stop, t_start, pairs, c0 = threading.Event(), time.monotonic(), 0, cpu_seconds(pid)
    poller = Poller(srv, stop, time.time() + args.seconds)
    while time.monotonic() < t_start + args.seconds and pairs < 10_000_000:
        path = os.path.join(srv.lines, f"unrelated-{pairs % 1000}")
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.unlink(path)
        pairs += 1
    busy = cpu_seconds(pid) - c0
    stop.set()
    worst, _ = poller.report()
    open_at_end, closed = srv.ending(names, t_start)
    print(f"quiet {args.seconds} s: serve used {quiet:.2f} s of CPU")
    print(f"churn {args.seconds} s: {pairs} create/unlink pairs ({pairs / args.seconds:.0f}/s) beside the links; serve used "
          f"{busy:.2f} s of CPU ({100 * busy / args.seconds:.0f}% of a core, {1e6 * busy / max(pairs, 1):.1f} us a pair)")
    print(f"terminals open at the end: {open_at_end} of {len(names)}; closed events: {len(closed)}")
    ok = all_open and open_at_end == len(names) and not closed and not poller.failures and busy < 0.25 * args.seconds
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
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # so that the cleanup runs
    with Serve(binary) as srv:
        try:
            return run(args, srv)
        except (RuntimeError, OSError) as e:
            print(f"error: {e}")
            return result(args.command, False, error=type(e).__name__)


if __name__ == "__main__":
    sys.exit(main())
