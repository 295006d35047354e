#!/usr/bin/env python3
"""Many terminals in one `pppbridge serve`: memory and idle CPU.

Starts `serve` on an empty configuration directory, then N terminals (our stack in the terminal
role, each `pppbridge run --pty --link PATH --role terminal --services echo`), and writes one
configuration file per terminal as it comes up, so serve picks each up from inotify. Once
`pppbridge ctl list` shows them all open it prints serve's RSS with 0 and N terminals, the
marginal RSS per terminal, serve's CPU over an idle minute (LCP echoes running), and checks the
metrics with promtool.

    Tools/serve-scale.py [--terminals 64] [--idle 60] [--binary .build/release/pppbridge]

Traffic stays on ptys and loopback. Prints `RESULT serve ...` as its last line.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def ctl(binary, control, *words):
    out = subprocess.run([binary, "ctl", "--control", control, *words], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout.splitlines()[0]) if out.stdout else {}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--terminals", type=int, default=64)
    parser.add_argument("--idle", type=int, default=60)
    parser.add_argument("--binary", default=".build/release/pppbridge")
    parser.add_argument("--metrics-port", type=int, default=9464)
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
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
        deadline = time.time() + 10
        while not os.path.exists(control) and time.time() < deadline:
            time.sleep(0.05)
        time.sleep(1)
        rss_empty = rss_kib(serve.pid)
        print(f"serve with 0 terminals: RSS {rss_empty} KiB")

        started = time.time()
        for n in range(args.terminals):
            link = os.path.join(lines, f"t{n:02d}")
            children.append(subprocess.Popen([binary, "run", "--pty", "--link", link, "--role", "terminal", "--services", "echo"],
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            while not os.path.lexists(link):
                time.sleep(0.01)
            with open(os.path.join(conf, f"t{n:02d}.conf.tmp"), "w") as f:
                f.write(f"device {link}\nlcp-echo-interval 5\n")
            # serve refuses a configuration file its group or others may write (umask 002).
            os.chmod(os.path.join(conf, f"t{n:02d}.conf.tmp"), 0o600)
            os.rename(os.path.join(conf, f"t{n:02d}.conf.tmp"), os.path.join(conf, f"t{n:02d}.conf"))
        listed = {}
        deadline = time.time() + 120
        while time.time() < deadline:
            listed = ctl(binary, control, "list")
            states = [t["state"] for t in listed.get("terminals", [])]
            if len(states) == args.terminals and all(s == "open" for s in states):
                break
            time.sleep(0.5)
        states = [t["state"] for t in listed.get("terminals", [])]
        opened = sum(1 for s in states if s == "open")
        print(f"ctl list: {len(states)} terminals, {opened} open, after {time.time() - started:.1f} s")
        time.sleep(5)
        rss_full = rss_kib(serve.pid)
        marginal = (rss_full - rss_empty) / max(args.terminals, 1)
        print(f"serve with {args.terminals} terminals: RSS {rss_full} KiB; marginal {marginal:.0f} KiB per terminal")

        before, t0 = cpu_seconds(serve.pid), time.time()
        time.sleep(args.idle)
        used, elapsed = cpu_seconds(serve.pid) - before, time.time() - t0
        print(f"idle {elapsed:.0f} s with LCP echo every 5 s: serve used {used:.2f} s of CPU, {100 * used / elapsed:.2f}% of a core")

        body = urllib.request.urlopen(f"http://127.0.0.1:{args.metrics_port}/metrics", timeout=10).read().decode()
        up = next((line.split()[1] for line in body.splitlines() if line.startswith("pppbridge_terminals_up ")), "?")
        promtool = shutil.which("promtool")
        check = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True) if promtool else None
        verdict = "not run (promtool missing)" if check is None else (
            f"exit {check.returncode}, printed {len(check.stdout + check.stderr)} bytes{(': ' + (check.stdout + check.stderr).strip()) if check.stdout + check.stderr else ''}")
        print(f"metrics: pppbridge_terminals_up {up}; promtool check metrics: {verdict}")
        print(f"RESULT serve terminals={args.terminals} open={opened} rss_empty_kib={rss_empty} rss_full_kib={rss_full} "
              f"marginal_kib={marginal:.0f} idle_cpu_percent={100 * used / elapsed:.2f} terminals_up={up}")
        return 0 if opened == args.terminals else 1
    finally:
        for c in reversed(children):
            c.send_signal(signal.SIGTERM)
        for c in children:
            try:
                c.wait(10)
            except subprocess.TimeoutExpired:
                c.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
