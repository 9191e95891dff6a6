#!/usr/bin/env python3
"""soak.py — drive a running `lamina serve` with a mix of well-formed and faulty clients,
then stop it with SIGTERM, and say whether it held up.

CLIENTS threads loop for SECONDS, each request picked at random (seeded per client):
  chat            POST /v1/chat/completions, max_tokens 12
  chat-stream     the same, streamed, read to [DONE]
  completion      POST /v1/completions, max_tokens 12
  embedding       POST /v1/embeddings
  cancel          a streamed chat closed after its first event
  slow-reader     a streamed chat read a few bytes at a time, with pauses
  oversized       a body over the server's limit (expects 413)
  malformed       broken JSON (expects 400)
Every REPORT seconds it prints the server's RSS and open file descriptors (from /proc). At the
end a few streams are left running, SIGTERM is sent, and the server must exit 0 within DRAIN
seconds.

Pass criteria (exit 1 otherwise): no 5xx or broken connection for a well-formed request, the
faulty ones get their 4xx, RSS at the end within 1.5x of the second report (the first comes
before warm-up; plus 64 MiB) and the fd count within 16 of it, a clean exit 0 after SIGTERM.

Usage: soak.py --pid PID --url http://127.0.0.1:PORT [--clients 16] [--seconds 600]
               [--report 30] [--drain 60] [--max-body-bytes 8388608]
Standard library only.
"""

import argparse
import http.client
import json
import os
import random
import signal
import socket
import sys
import threading
import time
import urllib.parse

KINDS = ["chat", "chat-stream", "completion", "embedding", "cancel", "slow-reader",
         "oversized", "malformed"]
WEIGHTS = [5, 5, 4, 3, 2, 2, 1, 1]


def rss_and_fds(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.count = {}
        self.bad = []

    def ok(self, kind):
        with self.lock:
            self.count[kind] = self.count.get(kind, 0) + 1

    def fail(self, kind, what):
        with self.lock:
            self.bad.append(f"{kind}: {what}")


def connect(url, timeout=120):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def chat_body(rng, stream):
    return {"messages": [{"role": "user", "content": f"Tell me about the number {rng.randint(1, 10**6)}."}],
            "max_tokens": 12, "temperature": 0.7, "seed": rng.randint(0, 1000), "stream": stream}


def one(url, kind, rng, stats, max_body):
    conn = connect(url)
    try:
        headers = {"Content-Type": "application/json"}
        if kind in ("chat", "completion", "embedding"):
            path, body = {
                "chat": ("/v1/chat/completions", chat_body(rng, False)),
                "completion": ("/v1/completions", {"prompt": f"Once upon a time {rng.random()}",
                                                    "max_tokens": 12}),
                "embedding": ("/v1/embeddings", {"input": f"some text {rng.random()}"}),
            }[kind]
            conn.request("POST", path, json.dumps(body), headers)
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                return stats.fail(kind, f"{r.status} {data[:200]!r}")
            json.loads(data)
        elif kind in ("chat-stream", "cancel", "slow-reader"):
            conn.request("POST", "/v1/chat/completions", json.dumps(chat_body(rng, True)), headers)
            r = conn.getresponse()
            if r.status != 200:
                return stats.fail(kind, f"{r.status} {r.read()[:200]!r}")
            if kind == "cancel":
                r.read(64)
                conn.sock.shutdown(socket.SHUT_RDWR)
            else:
                got = b""
                while True:
                    chunk = r.read(16 if kind == "slow-reader" else 4096)
                    if not chunk:
                        break
                    got += chunk
                    if kind == "slow-reader":
                        time.sleep(0.05)
                if b"[DONE]" not in got:
                    return stats.fail(kind, f"stream ended without [DONE]: {got[-200:]!r}")
        elif kind == "oversized":
            body = b'{"prompt": "' + b"x" * (max_body + 1024) + b'"}'
            try:
                conn.request("POST", "/v1/completions", body, headers)
                r = conn.getresponse()
                if r.status != 413:
                    return stats.fail(kind, f"expected 413, got {r.status}")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server may close before the whole body is sent: a refusal too
        else:
            conn.request("POST", "/v1/chat/completions", b'{"messages": [', headers)
            r = conn.getresponse()
            r.read()
            if r.status != 400:
                return stats.fail(kind, f"expected 400, got {r.status}")
        stats.ok(kind)
    except Exception as e:  # noqa: BLE001 - any failure of a well-formed request counts
        if kind not in ("cancel", "oversized"):
            stats.fail(kind, f"{type(e).__name__}: {e}")
        else:
            stats.ok(kind)
    finally:
        conn.close()


def client(url, i, deadline, stats, max_body):
    rng = random.Random(1000 + i)
    while time.time() < deadline:
        kind = rng.choices(KINDS, WEIGHTS)[0]
        one(url, kind, rng, stats, max_body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--report", type=float, default=30)
    ap.add_argument("--drain", type=float, default=60)
    ap.add_argument("--max-body-bytes", type=int, default=8 << 20)
    a = ap.parse_args()

    stats = Stats()
    t0 = time.time()
    deadline = t0 + a.seconds
    threads = [threading.Thread(target=client, args=(a.url, i, deadline, stats, a.max_body_bytes),
                                daemon=True) for i in range(a.clients)]
    for t in threads:
        t.start()
    samples = []
    while time.time() < deadline:
        rss, fds = rss_and_fds(a.pid)
        samples.append((rss, fds))
        with stats.lock:
            done = sum(stats.count.values())
        print(f"  t={time.time() - t0:6.0f} s  RSS {rss / 2**20:7.1f} MiB  fds {fds:4d}  requests {done}",
              flush=True)
        time.sleep(min(a.report, max(0.0, deadline - time.time())))
    for t in threads:
        t.join()
    rss, fds = rss_and_fds(a.pid)
    samples.append((rss, fds))
    print(f"  end       RSS {rss / 2**20:7.1f} MiB  fds {fds:4d}", flush=True)

    # SIGTERM with streams in flight: they finish, then the server exits 0.
    inflight = [threading.Thread(target=one, args=(a.url, "chat-stream", random.Random(i), stats,
                                                   a.max_body_bytes)) for i in range(4)]
    for t in inflight:
        t.start()
    time.sleep(0.2)
    t_term = time.time()
    os.kill(a.pid, signal.SIGTERM)
    for t in inflight:
        t.join(a.drain)
    exited = None
    while time.time() - t_term < a.drain:
        try:
            pid, status = os.waitpid(a.pid, os.WNOHANG)
        except ChildProcessError:
            # Not our child: watch /proc instead.
            if not os.path.exists(f"/proc/{a.pid}"):
                exited = 0
                break
            pid, status = 0, 0
        if pid == a.pid:
            exited = os.waitstatus_to_exitcode(status)
            break
        time.sleep(0.05)
    drain_s = time.time() - t_term

    print("\nrequests by kind:", json.dumps(dict(sorted(stats.count.items()))))
    failures = list(stats.bad)
    # The baseline is the second report: the first comes before the model's buffers warm up.
    (rss0, fds0) = samples[1] if len(samples) > 2 else samples[0]
    (rss1, fds1) = samples[-1]
    if rss1 > rss0 * 1.5 + (64 << 20):
        failures.append(f"RSS grew from {rss0 >> 20} to {rss1 >> 20} MiB")
    if fds1 > fds0 + 16:
        failures.append(f"file descriptors grew from {fds0} to {fds1}")
    if exited is None:
        failures.append(f"the server did not exit within {a.drain} s of SIGTERM")
    elif exited != 0:
        failures.append(f"the server exited with {exited} after SIGTERM")
    print(f"SIGTERM: exit status {exited} after {drain_s:.1f} s")
    if failures:
        print(f"\nFAILED ({len(failures)}):")
        for f in failures[:40]:
            print("  " + f)
        sys.exit(1)
    print("soak passed")


if __name__ == "__main__":
    main()
