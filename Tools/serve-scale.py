#!/usr/bin/env python3
"""Many terminals in one `pppbridge serve`: time to open, memory, idle CPU, and latency under load.

Starts `serve` on an empty configuration directory and `pppbridge simulate` with N terminals
(our stack in the terminal role, one process, one loop, each on its own pty serving echo on port
BASE+n), then writes one configuration file per terminal at once (`device`, `bridge
host:BASE+n`, LCP echo every 5 s), so serve picks them up from inotify. It measures:

- open_s: from the files appearing until `ctl list` shows every terminal open;
- serve's RSS with 0 and N terminals, and the marginal RSS per terminal;
- serve's CPU over an idle stretch (LCP echoes running);
- under load, every terminal doing one 200-byte request/response a second through its own
  bridge (one client connection each): the p50/p99 round trip and serve's CPU;
- the metrics, checked with promtool.

    Tools/serve-scale.py [--terminals 64] [--idle 60] [--load 30] [--binary .build/release/pppbridge]

Traffic stays on ptys and loopback. Prints `RESULT serve ...` as its last line; exits 1 when
not every terminal opened or a round trip came back wrong.
"""
import argparse
import json
import os
import random
import resource
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from proc_stats import cpu_seconds, rss_kib






def ctl(binary, control, *words):
    out = subprocess.run([binary, "ctl", "--control", control, *words], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout.splitlines()[0]) if out.stdout else {}


def wait_for(predicate, timeout, step=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def percentile(values, p):
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def load(ports, seconds, size=200):
    """One connection a port; each sends `size` bytes a second (staggered) and times the echo.
    Returns (round trips in ms, wrong answers, connections that failed)."""
    selector = selectors.DefaultSelector()
    conns = {}
    failed = 0
    for port in ports:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
        except OSError:
            failed += 1
            continue
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        c = {"port": port, "sock": s, "next": time.time() + random.random(), "sent_at": None, "payload": b"", "got": b""}
        conns[s.fileno()] = c
        selector.register(s, selectors.EVENT_READ, c)
    # A first round trip on every connection, not counted: the bridges' connections through
    # each link are set up (accept, SYN over PPP) before the clock starts.
    warm = {fd: False for fd in conns}
    for c in conns.values():
        c["sock"].sendall(b"w" * size)
    deadline = time.time() + 60
    while not all(warm.values()) and time.time() < deadline:
        for key, _ in selector.select(timeout=0.1):
            c = key.data
            try:
                chunk = c["sock"].recv(65536)
            except BlockingIOError:
                continue
            c["got"] += chunk
            if len(c["got"]) >= size or not chunk:
                warm[c["sock"].fileno()] = True
    failed += sum(1 for c in conns.values() if c["got"] != b"w" * size)
    for c in conns.values():
        c["got"] = b""
    rtts, wrong, slowest = [], 0, []
    begin = time.time()
    end = begin + seconds
    for c in conns.values():
        c["next"] = begin + random.random()
    while time.time() < end:
        now = time.time()
        for c in conns.values():
            if c["sent_at"] is None and now >= c["next"]:
                c["payload"] = random.randbytes(size)
                c["got"] = b""
                c["sent_at"] = now
                try:
                    c["sock"].sendall(c["payload"])
                except OSError:
                    failed += 1
                    c["sent_at"] = float("inf")
        for key, _ in selector.select(timeout=0.002):
            c = key.data
            try:
                chunk = c["sock"].recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                failed += 1
                selector.unregister(c["sock"])
                c["sent_at"] = float("inf")
                continue
            c["got"] += chunk
            if c["sent_at"] is not None and len(c["got"]) >= size:
                rtts.append((time.time() - c["sent_at"]) * 1000)
                slowest.append((rtts[-1], c["sent_at"] - begin, c["port"]))
                if c["got"] != c["payload"]:
                    wrong += 1
                c["next"] = c["sent_at"] + 1.0
                c["sent_at"] = None
    for c in conns.values():
        c["sock"].close()
    slowest.sort(reverse=True)
    print("slowest round trips (ms, sent at s, port):", ", ".join(f"{r:.1f} at {t:.2f} on {p}" for r, t, p in slowest[:8]))
    return rtts, wrong, failed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--terminals", type=int, default=64)
    parser.add_argument("--idle", type=int, default=60)
    parser.add_argument("--load", type=int, default=30)
    parser.add_argument("--binary", default=".build/release/pppbridge")
    parser.add_argument("--metrics-port", type=int, default=9464)
    parser.add_argument("--base-port", type=int, default=20000)
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = tempfile.mkdtemp(prefix="pppbridge-scale-")
    os.chmod(work, 0o700)
    conf, lines = os.path.join(work, "conf"), os.path.join(work, "lines")
    os.makedirs(conf)
    os.makedirs(lines)
    control = os.path.join(work, "control")
    children = []
    try:
        serve = subprocess.Popen([binary, "serve", "--config", conf, "--control", control,
                                  "--metrics", f"127.0.0.1:{args.metrics_port}"],
                                 stdout=open(os.path.join(work, "serve.log"), "w"), stderr=subprocess.STDOUT)
        children.append(serve)
        wait_for(lambda: os.path.exists(control), 10)
        time.sleep(1)
        rss_empty = rss_kib(serve.pid)
        print(f"serve with 0 terminals: RSS {rss_empty} KiB")

        simulate = subprocess.Popen([binary, "simulate", "--terminals", str(args.terminals), "--dir", lines,
                                     "--echo-base", str(args.base_port)],
                                    stdout=open(os.path.join(work, "simulate.log"), "w"), stderr=subprocess.STDOUT)
        children.append(simulate)
        last = os.path.join(lines, f"t{args.terminals - 1}")
        if not wait_for(lambda: os.path.lexists(last), 60):
            print("the simulator did not make its links")
            return 1
        for n in range(args.terminals):
            tmp = os.path.join(conf, f"t{n}.conf.tmp")
            with open(tmp, "w") as f:
                f.write(f"device {os.path.join(lines, f't{n}')}\nlcp-echo-interval 5\nbridge host:{args.base_port + n}\n")
            # serve refuses a configuration file its group or others may write (umask 002).
            os.chmod(tmp, 0o600)
        started = time.time()
        for n in range(args.terminals):
            os.rename(os.path.join(conf, f"t{n}.conf.tmp"), os.path.join(conf, f"t{n}.conf"))
        listed = {}
        deadline = time.time() + 300
        opened_at = None
        while time.time() < deadline:
            listed = ctl(binary, control, "list")
            states = [t["state"] for t in listed.get("terminals", [])]
            if len(states) == args.terminals and all(s == "open" for s in states):
                opened_at = time.time()
                break
            time.sleep(0.25)
        states = [t["state"] for t in listed.get("terminals", [])]
        opened = sum(1 for s in states if s == "open")
        open_s = (opened_at or time.time()) - started
        print(f"ctl list: {len(states)} terminals, {opened} open, {open_s:.1f} s after their files appeared")
        time.sleep(5)
        rss_full = rss_kib(serve.pid)
        marginal = (rss_full - rss_empty) / max(args.terminals, 1)
        print(f"serve with {args.terminals} terminals: RSS {rss_full} KiB; marginal {marginal:.0f} KiB per terminal")

        before, t0 = cpu_seconds(serve.pid), time.time()
        time.sleep(args.idle)
        used, elapsed = cpu_seconds(serve.pid) - before, time.time() - t0
        idle_cpu = 100 * used / elapsed
        print(f"idle {elapsed:.0f} s with LCP echo every 5 s: serve used {used:.2f} s of CPU, {idle_cpu:.2f}% of a core")

        before, t0 = cpu_seconds(serve.pid), time.time()
        rtts, wrong, failed = load([args.base_port + n for n in range(args.terminals)], args.load)
        used, elapsed = cpu_seconds(serve.pid) - before, time.time() - t0
        load_cpu = 100 * used / elapsed
        p50, p99 = percentile(rtts, 50), percentile(rtts, 99)
        print(f"load {elapsed:.0f} s, {len(rtts)} round trips of 200 B ({len(rtts) / elapsed:.0f}/s), {wrong} wrong, "
              f"{failed} connections failed: p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(rtts or [0]):.2f} ms; serve {load_cpu:.1f}% of a core")

        body = urllib.request.urlopen(f"http://127.0.0.1:{args.metrics_port}/metrics", timeout=10).read().decode()
        up = next((line.split()[1] for line in body.splitlines() if line.startswith("pppbridge_terminals_up ")), "?")
        promtool = shutil.which("promtool")
        check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True) if promtool else None
        verdict = "not run (promtool missing)" if check is None else (
            f"exit {check.returncode}, printed {len(check.stdout + check.stderr)} bytes{(': ' + (check.stdout + check.stderr).strip()[:300]) if check.stdout + check.stderr else ''}")
        print(f"metrics: pppbridge_terminals_up {up}; promtool check metrics: {verdict}")
        print(f"RESULT serve terminals={args.terminals} open={opened} open_s={open_s:.1f} rss_empty_kib={rss_empty} rss_full_kib={rss_full} "
              f"marginal_kib={marginal:.0f} idle_cpu_percent={idle_cpu:.2f} p50_ms={p50:.2f} p99_ms={p99:.2f} "
              f"load_cpu_percent={load_cpu:.1f} round_trips={len(rtts)} wrong={wrong} failed={failed} terminals_up={up}")
        return 0 if opened == args.terminals and wrong == 0 and failed == 0 else 1
    finally:
        for c in reversed(children):
            c.send_signal(signal.SIGTERM)
        for c in children:
            try:
                c.wait(20)
            except subprocess.TimeoutExpired:
                c.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
