#!/usr/bin/env python3
"""A soak of faults against `pppbridge serve`: nothing may be lost, nothing may leak.

Runs `serve` (holdoff 1 s, LCP echo every second, three missed end a link) and `pppbridge
simulate` with N terminals (a few of them misbehaving all the time: silent, refusing LCP,
noisy), writes a configuration file for each (a bridge host:BASE+n to its echo port), and for
`--seconds` drives faults at random while data flows:

- hang-ups, and devices that disappear and come back (the simulator's links removed and made
  again after up to 8 s);
- bursts of line noise (bit errors at 1e-3) and terminals that go silent;
- configuration files edited, renamed, removed and put back;
- bridges added and removed through the control socket;
- floods on the control socket (blank lines and garbage) and on bridges (megabytes never read);
- descriptor pressure (a hundred clients held on one terminal's bridge).

Meanwhile workers send random data through the bridges and check it comes back intact
(SHA-256 of what was sent against what came back). It checks, and prints as `RESULT soak`:

- crashes: serve or the simulator died (or serve did not exit 0 on SIGTERM);
- reopened_late: a terminal that is healthy again (its device back, its silence or noise over,
  its file back) not open within its holdoff plus 5 s (an edited or renamed file: from when
  serve lists it again after its old link's close, which is bounded on its own by serve's
  close grace, RFC 1661's two Terminate-Requests, plus 5 s);
- bytes_lost: bytes sent through a bridge of a link that was healthy for the whole transfer
  that did not come back intact;
- fd_delta, rss_delta_percent: serve's descriptors and RSS after every terminal is removed,
  against the same before any was added (±2 descriptors, 10%);
- metrics_mismatches: a fault-free control group's bridge counters (connections and bytes both
  ways) and link opens and closes against what the soak did to them, and the terminal counts.

    Tools/serve-soak.py --seconds 600 --terminals 256 [--binary .build/release/pppbridge]

Traffic stays on ptys and loopback. Exits 1 when a check fails.
"""
import argparse
import hashlib
import json
import os
import random
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from proc_stats import fd_count, rss_kib, rss_split

HOLDOFF = 1
GRACE = 5
# An edited or renamed file closes its link first: LCP Terminate-Request until the peer's
# Terminate-Ack, at most Max-Terminate (2) Restart timers (3 s) (RFC 1661 section 4.6), which
# serve gives up on after its close grace of 7 s. Meanwhile the terminal is not listed (serve
# lists no terminal it is retiring, nor the file waiting for it). The reopen is timed from when
# the name is listed again; the close is bounded on its own.
CLOSE_BOUND = 7








def fd_targets(pid):
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            out[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return out


class Control:
    """One JSON request a line on a Unix socket, one answer a line."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()

    def request(self, obj, timeout=10):
        with self.lock:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(timeout)
            try:
                s.connect(self.path)
                s.sendall((json.dumps(obj) + "\n").encode())
                data = b""
                while not data.endswith(b"\n"):
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    data += chunk
                return json.loads(data.decode().splitlines()[0]) if data else {}
            except (OSError, ValueError):
                return {}
            finally:
                s.close()


class Soak:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.conf = os.path.join(work, "conf")
        self.lines = os.path.join(work, "lines")
        self.lock = threading.Lock()
        self.rng = random.Random(args.seed)
        n = args.terminals
        # The last few misbehave all the time (excluded from the checks); the first 16 are a
        # control group that gets data and nothing else.
        self.silent = {n - 1, n - 2}
        self.refusing = {n - 3, n - 4}
        self.noisy = {n - 5, n - 6}
        self.standing = self.silent | self.refusing | self.noisy
        self.control_group = set(range(16))
        self.fileName = {i: f"t{i}" for i in range(n)}  # the current file's name (renames)
        self.present = {i: True for i in range(n)}  # its file is in the directory
        # Terminal -> (disturbed since, healthy again at or None while the fault lasts).
        self.disturbed = {}
        # Terminals whose file was edited or renamed: "changing" until the old link is seen to
        # go (serve lists no terminal it is retiring, nor the file waiting for its line), then
        # "closing" until the name is listed again.
        self.replacing = {}
        # How long each seen close of a replaced file's old link took (to its name listed again).
        self.closes = []
        self.history = {i: [] for i in range(n)}  # (start, end) intervals, for the data check
        self.busy = {i: [] for i in range(n)}  # floods and pressure: excluded from the data check
        self.faults = 0
        self.kinds = {}
        self.reopened_late = []
        self.reopened = 0
        self.bytes_lost = 0
        self.bytes_checked = 0
        self.transfers = 0
        self.interrupted = 0
        self.control_group_traffic = {i: [0, 0, 0] for i in self.control_group}  # connections, to terminal, to host
        self.stop = threading.Event()
        self.last_kind = {}

    def port(self, i):
        return self.args.base_port + i

    def write_conf(self, i, name=None, echo=1):
        name = name or self.fileName[i]
        path = os.path.join(self.conf, name + ".conf")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"device {os.path.join(self.lines, f't{i}')}\nlcp-echo-interval {echo}\nlcp-echo-failure 3\n"
                    f"holdoff {HOLDOFF}\nbridge host:{self.port(i)}\n")
        os.chmod(tmp, 0o600)
        os.rename(tmp, path)

    # Faults --------------------------------------------------------------------------------

    def candidates(self):
        with self.lock:
            return [i for i in range(self.args.terminals)
                    if i not in self.standing and i not in self.control_group and i not in self.disturbed]

    def begin(self, i, kind, ends_in, replacing=False):
        """Terminal i is disturbed from now; healthy again `ends_in` seconds on (or, when its
        file was replaced, once serve lists it again)."""
        now = time.time()
        with self.lock:
            self.disturbed[i] = (now, now + ends_in)
            if replacing:
                self.replacing[i] = "changing"
            self.last_kind[i] = kind
            self.faults += 1
            self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def one_fault(self):
        pool = self.candidates()
        if not pool:
            return
        i = self.rng.choice(pool)
        kind = self.rng.choice(["hangup", "disappear", "noise", "silence", "edit", "rename", "remove",
                                "bridge", "control-flood", "bridge-flood", "pressure"])
        sim, ctl = self.sim, self.ctl
        if kind == "hangup":
            self.begin(i, kind, 0)
            sim.request({"cmd": "hangup", "terminal": i, "downFor": 0})
        elif kind == "disappear":
            down = self.rng.uniform(1, 8)
            self.begin(i, kind, down)
            sim.request({"cmd": "hangup", "terminal": i, "downFor": down})
        elif kind == "noise":
            d = self.rng.uniform(1, 3)
            self.begin(i, kind, d)
            sim.request({"cmd": "noise", "terminal": i, "ber": 0.001, "for": d})
        elif kind == "silence":
            d = self.rng.uniform(2, 6)
            self.begin(i, kind, d)
            sim.request({"cmd": "silence", "terminal": i, "for": d})
        elif kind == "edit":
            self.begin(i, kind, 0, replacing=True)
            self.write_conf(i, echo=self.rng.choice([1, 2]))
        elif kind == "rename":
            old = self.fileName[i]
            new = f"t{i}" if old != f"t{i}" else f"t{i}-renamed"
            with self.lock:
                self.fileName[i] = new
            self.begin(i, kind, 0, replacing=True)
            os.rename(os.path.join(self.conf, old + ".conf"), os.path.join(self.conf, new + ".conf"))
        elif kind == "remove":
            away = self.rng.uniform(1, 4)
            self.begin(i, kind, away)
            os.unlink(os.path.join(self.conf, self.fileName[i] + ".conf"))
            self.present[i] = False

            def restore():
                time.sleep(away)
                self.write_conf(i)
                self.present[i] = True
            threading.Thread(target=restore, daemon=True).start()
        elif kind == "bridge":
            # Not a disturbance of the link: a second bridge comes and goes.
            with self.lock:
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
                self.faults += 1
            extra = f"host:{self.args.base_port + 4000 + i}"
            a = ctl.request({"cmd": "add-bridge", "terminal": self.fileName[i], "bridge": extra})
            time.sleep(0.2)
            b = ctl.request({"cmd": "remove-bridge", "terminal": self.fileName[i], "bridge": extra})
            if not a.get("ok") or not b.get("ok"):
                self.bridge_failures.append((i, a, b))
        else:
            with self.lock:
                self.kinds[kind] = self.kinds.get(kind, 0) + 1
                self.faults += 1
                self.busy[i].append((time.time(), time.time() + 5))
            threading.Thread(target=getattr(self, kind.replace("-", "_")), args=(i,), daemon=True).start()

    def control_flood(self, i):
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(self.control_path)
            s.setblocking(False)
            end = time.time() + 2
            junk = b"\n" * 4096 + b"{not json\n" + b"x" * 3000 + b"\n"
            while time.time() < end:
                try:
                    s.send(junk)
                except BlockingIOError:
                    time.sleep(0.001)
                except OSError:
                    break
        except OSError:
            pass
        finally:
            s.close()

    def bridge_flood(self, i):
        try:
            s = socket.create_connection(("127.0.0.1", self.port(i)), timeout=5)
            s.setblocking(False)
            blob, sent, end = os.urandom(65536), 0, time.time() + 2
            while time.time() < end and sent < 4 << 20:
                try:
                    sent += s.send(blob)
                except BlockingIOError:
                    time.sleep(0.005)
                except OSError:
                    break
            s.close()
        except OSError:
            pass

    def pressure(self, i):
        held = []
        for _ in range(100):
            try:
                held.append(socket.create_connection(("127.0.0.1", self.port(i)), timeout=2))
            except OSError:
                break
        time.sleep(3)
        for s in held:
            s.close()

    # Recovery ------------------------------------------------------------------------------

    def watch(self):
        """Every half second: which disturbed terminals are open again, and how late."""
        while not self.stop.is_set() or self.disturbed:
            listed = self.ctl.request({"cmd": "list"})
            states = {t["name"]: t["state"] for t in listed.get("terminals", [])}
            now = time.time()
            with self.lock:
                for i, (start, healthy_at) in list(self.disturbed.items()):
                    if not self.present[i] or now < healthy_at:
                        continue
                    phase = self.replacing.get(i)
                    state = states.get(self.fileName[i])
                    if phase == "changing":
                        if state is None:
                            phase = self.replacing[i] = "closing"
                        elif state != "open":
                            # Already the new terminal: its reopen is timed from now.
                            del self.replacing[i]
                            self.disturbed[i] = (start, now)
                            continue
                        elif now - start > 2:
                            # The change was never seen (a close quicker than a poll): timed
                            # from the fault, as any other.
                            del self.replacing[i]
                        else:
                            self.disturbed[i] = (start, now)
                            continue
                    if phase == "closing":
                        if state is not None:
                            del self.replacing[i]
                            self.closes.append(healthy_at - start)
                        elif now - start > CLOSE_BOUND + GRACE + 0.5:
                            # The old link never let go: counted once, then no longer watched.
                            self.reopened_late.append((i, self.last_kind.get(i), "close", round(now - start, 1)))
                            self.history[i].append((start, now))
                            del self.disturbed[i]
                            del self.replacing[i]
                            continue
                        else:
                            # The old link is still closing: the reopen's clock starts when
                            # serve lists the terminal again.
                            self.disturbed[i] = (start, now)
                            continue
                    if states.get(self.fileName[i]) == "open" and now - healthy_at > 0.3:
                        late = now - healthy_at
                        self.history[i].append((start, now))
                        del self.disturbed[i]
                        self.replacing.pop(i, None)
                        self.reopened += 1
                        if late > HOLDOFF + GRACE + 0.5:
                            self.reopened_late.append((i, self.last_kind.get(i), round(late, 1)))
                    elif now - healthy_at > HOLDOFF + GRACE + 60:
                        # Never came back: counted once, then no longer watched.
                        self.reopened_late.append((i, self.last_kind.get(i), "never"))
                        self.history[i].append((start, now))
                        del self.disturbed[i]
                        self.replacing.pop(i, None)
            if self.stop.is_set() and time.time() > self.stop_time + 90:
                break
            time.sleep(0.5)

    # Data ----------------------------------------------------------------------------------

    def healthy_throughout(self, i, a, b):
        with self.lock:
            if i in self.disturbed and self.disturbed[i][0] <= b + 1:
                return False
            for s, e in self.history[i] + self.busy[i]:
                if s <= b + 1 and e >= a - 2:
                    return False
            return True

    def transfer(self, i, size):
        payload = os.urandom(size)
        got = bytearray()
        a = time.time()
        ok = False
        try:
            s = socket.create_connection(("127.0.0.1", self.port(i)), timeout=30)
            s.settimeout(30)
            def send():
                try:
                    s.sendall(payload)
                    s.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
            sender.join(30)
            s.close()
            ok = True
        except OSError:
            pass
        b = time.time()
        intact = ok and hashlib.sha256(bytes(got)).digest() == hashlib.sha256(payload).digest()
        with self.lock:
            self.transfers += 1
        if self.healthy_throughout(i, a, b):
            with self.lock:
                self.bytes_checked += size
                if not intact:
                    good = 0
                    while good < min(len(got), size) and got[good] == payload[good]:
                        good += 1
                    self.bytes_lost += size - good
                    self.losses.append((i, size, len(got), round(a - self.started, 1), round(b - a, 1)))
                if i in self.control_group and ok:
                    c = self.control_group_traffic[i]
                    c[0] += 1
                    c[1] += size
                    c[2] += len(got)
        else:
            with self.lock:
                self.interrupted += 1
                if i in self.control_group:
                    # Never disturbed: a failure here is a loss all the same.
                    self.bytes_lost += size
                    self.losses.append((i, size, len(got), round(a - self.started, 1), round(b - a, 1)))

    def worker(self):
        rng = random.Random(self.rng.random())
        healthy = [i for i in range(self.args.terminals) if i not in self.standing]
        while not self.stop.is_set():
            i = rng.choice(healthy) if rng.random() < 0.7 else rng.choice(sorted(self.control_group))
            with self.lock:
                skip = i in self.disturbed or not self.present[i]
            if skip:
                continue
            self.transfer(i, rng.randint(1, 64) * 1024)

    # Metrics -------------------------------------------------------------------------------

    def metrics(self):
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.args.metrics_port}/metrics", timeout=10).read().decode()
        values = {}
        for line in body.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            key, _, value = line.rpartition(" ")
            try:
                values[key] = float(value)
            except ValueError:
                pass
        return values

    def group_metrics(self, values):
        out = {}
        for i in self.control_group:
            t = f'terminal="t{i}"'
            b = f'bridge="host:{self.port(i)}"'
            out[i] = (values.get(f'pppbridge_bridge_connections_total{{{t},{b}}}', -1),
                      values.get(f'pppbridge_bridge_bytes_total{{{t},{b},direction="to_terminal"}}', -1),
                      values.get(f'pppbridge_bridge_bytes_total{{{t},{b},direction="to_host"}}', -1),
                      values.get(f'pppbridge_link_opens_total{{{t}}}', -1),
                      sum(v for k, v in values.items() if k.startswith("pppbridge_link_closes_total{" + t + ",")))
        return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--terminals", type=int, default=256)
    parser.add_argument("--binary", default=".build/release/pppbridge")
    parser.add_argument("--metrics-port", type=int, default=9465)
    parser.add_argument("--base-port", type=int, default=20000,
                        help="bridges on BASE+n, the extra ones on BASE+4000+n (below the ephemeral ports)")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--fault-every", type=float, default=0.25, help="seconds between faults")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.terminals < 32:
        parser.error("--terminals: at least 32 (a control group of 16 and 6 standing misbehavers)")
    binary = os.path.abspath(args.binary)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = tempfile.mkdtemp(prefix="pppbridge-soak-")
    os.chmod(work, 0o700)
    soak = Soak(args, work)
    soak.losses, soak.bridge_failures = [], []
    os.makedirs(soak.conf)
    os.makedirs(soak.lines)
    control = soak.control_path = os.path.join(work, "control")
    sim_control = os.path.join(work, "simulate.sock")
    serve = simulate = None
    crashes = []
    try:
        serve = subprocess.Popen([binary, "serve", "--config", soak.conf, "--control", control, "--metrics",
                                  f"127.0.0.1:{args.metrics_port}", "--holdoff", str(HOLDOFF), "--maxfail", "0"],
                                 stdout=open(os.path.join(work, "serve.log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 10
        while not os.path.exists(control) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1)
        fd_empty, rss_empty = fd_count(serve.pid), rss_kib(serve.pid)
        n = args.terminals
        simulate = subprocess.Popen([binary, "simulate", "--terminals", str(n), "--dir", soak.lines, "--control", sim_control,
                                     "--echo-base", str(args.base_port), "--restart-delay", "300",
                                     "--misbehave", "silent:2", "--misbehave", "refuse-lcp:2", "--misbehave", "noise:2",
                                     "--ber", "0.01", "--seed", str(args.seed)],
                                    stdout=open(os.path.join(work, "simulate.log"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while not os.path.exists(sim_control) and time.time() < deadline:
            time.sleep(0.05)
        soak.sim, soak.ctl = Control(sim_control), Control(control)
        healthy = [i for i in range(n) if i not in soak.standing]

        def bring_up():
            for i in range(n):
                soak.write_conf(i)
            deadline = time.time() + 120
            states = {}
            while time.time() < deadline:
                states = {t["name"]: t["state"] for t in soak.ctl.request({"cmd": "list"}).get("terminals", [])}
                if all(states.get(f"t{i}") == "open" for i in healthy):
                    break
                time.sleep(0.5)
            return sum(1 for i in healthy if states.get(f"t{i}") == "open")

        def remove_all():
            for name in os.listdir(soak.conf):
                os.unlink(os.path.join(soak.conf, name))
            deadline = time.time() + 60
            while time.time() < deadline and soak.ctl.request({"cmd": "list"}).get("terminals", [None]):
                time.sleep(0.5)
            # A terminal removed still closes its link politely (LCP Terminate, up to 7 s
            # against a peer that never answers); then its line goes, and the heap is given back.
            deadline = time.time() + 30
            while time.time() < deadline and fd_count(serve.pid) > fd_empty + 2:
                time.sleep(0.5)
            time.sleep(3)

        soak.started = time.time()
        # A first round, not counted: every terminal up, one transfer on each, all removed. The
        # baseline is serve after it (the code pages a first link touches are the binary's and
        # the libraries', read in once; they are not what a leak would be).
        bring_up()
        for i in healthy:
            soak.transfer(i, 65536)
        remove_all()
        fd_base, rss_base = fd_count(serve.pid), rss_kib(serve.pid)
        anon_base, file_base = rss_split(serve.pid)
        fds_before = fd_targets(serve.pid)
        soak.transfers = soak.bytes_checked = 0
        soak.control_group_traffic = {i: [0, 0, 0] for i in soak.control_group}
        opened = bring_up()
        print(f"serve before any terminal: {fd_empty} descriptors, RSS {rss_empty} KiB; after a first round of every terminal: "
              f"{fd_base} descriptors, RSS {rss_base} KiB (anonymous {anon_base}, file {file_base}); "
              f"{opened} of {len(healthy)} healthy terminals open", flush=True)
        before = soak.group_metrics(soak.metrics())

        soak.started = time.time()
        watcher = threading.Thread(target=soak.watch, daemon=True)
        watcher.start()
        workers = [threading.Thread(target=soak.worker, daemon=True) for _ in range(args.workers)]
        for w in workers:
            w.start()
        end = time.time() + args.seconds
        next_report = time.time() + 60
        while time.time() < end:
            soak.one_fault()
            for p, name in ((serve, "serve"), (simulate, "simulate")):
                if p.poll() is not None and name not in crashes:
                    crashes.append(name)
            if crashes:
                break
            if time.time() >= next_report:
                next_report += 60
                print(f"  {time.time() - soak.started:.0f} s: {soak.faults} faults, {soak.transfers} transfers, "
                      f"{soak.reopened} reopened, {len(soak.reopened_late)} late, {soak.bytes_lost} bytes lost", flush=True)
            time.sleep(args.fault_every * soak.rng.uniform(0.5, 1.5))
        soak.stop_time = time.time()
        soak.stop.set()
        for w in workers:
            w.join(60)
        watcher.join(120)
        after = soak.group_metrics(soak.metrics())

        # The control group: the metrics against what the soak did to them.
        mismatches = []
        for i in sorted(soak.control_group):
            c = soak.control_group_traffic[i]
            b, a = before[i], after[i]
            did = (c[0], c[1], c[2], 0, 0)
            seen = tuple(int(a[k] - b[k]) for k in range(5))
            if seen != did:
                mismatches.append(f"t{i}: metrics {seen}, soak {did}")
        values = soak.metrics()
        listed = soak.ctl.request({"cmd": "list"}).get("terminals", [])
        open_now = sum(1 for t in listed if t["state"] == "open")
        if values.get("pppbridge_terminals") != len(listed) or values.get("pppbridge_terminals_up") != open_now:
            mismatches.append(f"terminals {values.get('pppbridge_terminals')}/{len(listed)}, up {values.get('pppbridge_terminals_up')}/{open_now}")

        # Every terminal removed: serve back to where it started.
        remove_all()
        fd_after, rss_after = fd_count(serve.pid), rss_kib(serve.pid)
        anon_after, file_after = rss_split(serve.pid)
        fd_delta = fd_after - fd_base
        if fd_delta:
            print(f"descriptors not there before: {sorted(set(fd_targets(serve.pid).items()) - set(fds_before.items()))}")
        rss_delta = 100 * (rss_after - rss_base) / rss_base
        for p, name in ((serve, "serve"), (simulate, "simulate")):
            if p.poll() is not None and name not in crashes:
                crashes.append(name)
        serve.send_signal(signal.SIGTERM)
        try:
            if serve.wait(30) != 0 and "serve" not in crashes:
                crashes.append(f"serve exit {serve.returncode}")
        except subprocess.TimeoutExpired:
            crashes.append("serve did not stop")
        print(f"faults by kind: {json.dumps(soak.kinds, sort_keys=True)}")
        print(f"transfers {soak.transfers} ({soak.bytes_checked} B on healthy links checked, {soak.interrupted} crossed a fault); "
              f"{soak.reopened} recoveries; {len(soak.closes)} closes of an edited or renamed file's link seen"
              + (f", the longest {max(soak.closes):.1f} s" if soak.closes else ""))
        if soak.losses:
            print(f"losses (terminal, sent, got, at s, took s): {soak.losses[:10]}")
        if soak.reopened_late:
            print(f"reopened late (terminal, fault, seconds): {soak.reopened_late[:20]}")
        if soak.bridge_failures:
            print(f"bridge add/remove refused: {soak.bridge_failures[:5]}")
        if mismatches:
            print(f"metrics mismatches: {mismatches[:10]}")
        print(f"serve after every terminal was removed: {fd_after} descriptors (before {fd_base}), RSS {rss_after} KiB "
              f"(anonymous {anon_after}, file {file_after}; before {rss_base}, {anon_base}, {file_base})")
        if crashes:
            print(f"crashes: {crashes}; the last of serve's log:")
            with open(os.path.join(work, "serve.log")) as f:
                print("".join(f.readlines()[-30:]))
        print(f"RESULT soak seconds={args.seconds} terminals={n} faults={soak.faults} crashes={len(crashes)} "
              f"reopened_late={len(soak.reopened_late)} bytes_lost={soak.bytes_lost} fd_delta={fd_delta} "
              f"rss_delta_percent={rss_delta:.1f} transfers={soak.transfers} bytes_checked={soak.bytes_checked} "
              f"metrics_mismatches={len(mismatches)} bridge_failures={len(soak.bridge_failures)}")
        good = (not crashes and not soak.reopened_late and soak.bytes_lost == 0 and abs(fd_delta) <= 2 and rss_delta <= 10
                and not mismatches and not soak.bridge_failures and soak.bytes_checked > 0)
        return 0 if good else 1
    finally:
        for p in (simulate, serve):
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        if os.environ.get("SOAK_KEEP"):
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
