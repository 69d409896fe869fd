#!/usr/bin/env python3
"""Scrapes of /metrics while lingering connections hold its slots.

Starts attnaudit-server on loopback (defaults: 256 connections, 64 per
source address), then, per phase, opens N connections that each send a
GET /metrics, read the answer and then trickle one byte every few seconds
without closing (a slow or hostile client, or a proxy that keeps them
open), and scrapes /metrics K times with a 2 s timeout each. Prints, per
phase, how many scrapes were answered and how many lingering connections
the server closed.

  python3 bench/sweeps/metrics_linger.py --bin-dir build/bin [--json OUT]

Phases: 256 connections from 4 other addresses (127.0.0.2-5), then 64
from the scraper's own address (127.0.0.1, a proxy in front of it).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time

GET = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin-dir", default="build/bin")
    p.add_argument("--scrapes", type=int, default=60)
    p.add_argument("--trickle-s", type=float, default=5.0)
    p.add_argument("--json")
    return p.parse_args()


def start_server(bin_dir, workdir):
    log_path = os.path.join(workdir, "server.log")
    log = open(log_path, "w")
    proc = subprocess.Popen(
        [os.path.join(bin_dir, "attnaudit-server"), "--listen", "127.0.0.1:0",
         "--metrics-listen", "127.0.0.1:0", "--data-dir",
         os.path.join(workdir, "data")], stdout=subprocess.DEVNULL, stderr=log)
    pattern = re.compile(r'msg="metrics listening" addr=127\.0\.0\.1:(\d+)')
    for _ in range(400):
        with open(log_path) as f:
            m = pattern.search(f.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the server did not report its metrics port")


class Lingerers:
    """Connections that read one answer, then trickle a byte now and then."""

    def __init__(self, trickle_s):
        self.socks = []
        self.closed = 0
        self.trickle_s = trickle_s
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._trickle, daemon=True)
        self.thread.start()

    def add(self, port, source):
        s = socket.socket()
        s.bind((source, 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        s.sendall(GET)
        s.recv(65536)  # the answer's first bytes: the connection was served
        self.socks.append(s)

    def _trickle(self):
        while not self.stop.wait(self.trickle_s):
            for s in list(self.socks):
                try:
                    s.send(b"x")
                except OSError:
                    self.socks.remove(s)
                    self.closed += 1

    def close(self):
        self.stop.set()
        for s in self.socks:
            s.close()


def scrape(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(GET)
            return s.recv(12).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def phase(port, sources, per_source, scrapes, trickle_s):
    held = Lingerers(trickle_s)
    opened = 0
    for src in sources:
        for _ in range(per_source):
            try:
                held.add(port, src)
                opened += 1
            except OSError:
                pass
    answered = 0
    for _ in range(scrapes):
        answered += scrape(port)
        time.sleep(0.05)
    result = {"lingering": opened, "sources": len(sources),
              "scrapes": scrapes, "answered": answered,
              "lingering_closed_by_server": held.closed}
    held.close()
    return result


def main():
    args = parse_args()
    workdir = tempfile.mkdtemp(prefix="attnaudit_linger_")
    proc, port = start_server(args.bin_dir, workdir)
    try:
        results = [
            phase(port, ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"],
                  64, args.scrapes, args.trickle_s),
            phase(port, ["127.0.0.1"], 64, args.scrapes, args.trickle_s),
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(workdir, ignore_errors=True)
    for r in results:
        print(f"{r['lingering']} lingering from {r['sources']} address(es): "
              f"{r['answered']}/{r['scrapes']} scrapes answered")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
