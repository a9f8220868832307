#!/usr/bin/env python3
"""The embedded store on a disk that fills up, then gets space back: the measurement behind the
full-disk row of SECURITY.md.

Usage (as root, where mounting is allowed):
    python3 scripts/disk_full.py target/debug/changehub [FULL_SECONDS] [AFTER_SECONDS] [WORKERS]

Mounts a 64 MiB tmpfs, serves the hub with its data folder there (its log goes to a file
outside the tmpfs), and has WORKERS (default 8) loopback clients post batches of 20 changes
without pause. After 3 s a filler file fills the tmpfs; FULL_SECONDS later (default 45) the
filler is removed, and the load goes on for AFTER_SECONDS (default 15). It prints the answers
by status in each phase, the log bytes written while the disk was full, how long writes took to
be accepted again, and whether every acknowledged change is in the log — then kills the hub
(SIGKILL), starts it again on the same data, and checks once more. Unmounts at the end."""
import collections, json, os, re, signal, socket, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request

BIN = sys.argv[1]
FULL = float(sys.argv[2]) if len(sys.argv) > 2 else 45
AFTER = float(sys.argv[3]) if len(sys.argv) > 3 else 15
WORKERS = int(sys.argv[4]) if len(sys.argv) > 4 else 8

mount = tempfile.mkdtemp(prefix="changehub-disk-full-")
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", mount], check=True)
data = os.path.join(mount, "data")
filler = os.path.join(mount, "filler")
log_path = tempfile.mktemp(prefix="changehub-disk-full-", suffix=".log")
probe = socket.socket(); probe.bind(("127.0.0.1", 0)); port = probe.getsockname()[1]; probe.close()
base = f"http://127.0.0.1:{port}"


def start():
    log = open(log_path, "ab")
    hub = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{port}", "--channel", "news=t",
                            "--data-dir", data], stdout=log, stderr=log)
    for _ in range(200):
        try:
            urllib.request.urlopen(f"{base}/readyz", timeout=2).read()
            return hub
        except Exception:
            time.sleep(0.05)
    raise SystemExit("the hub did not become ready")


def get(path):
    try:
        with urllib.request.urlopen(f"{base}{path}", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(body):
    req = urllib.request.Request(f"{base}/channels/news/changes", data=body, method="POST",
                                 headers={"Authorization": "Bearer t",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, None
    except Exception:
        return 0, None


phase = "before"
answers = []  # (time, phase, status)
acked = []  # (first, last)
lock = threading.Lock()
stop = threading.Event()


def worker(w):
    n = 0
    while not stop.is_set():
        body = json.dumps([{"loc": f"http://example.com/w{w}/{n}/{i}", "change": "updated"}
                           for i in range(20)]).encode()
        n += 1
        status, answer = post(body)
        with lock:
            answers.append((time.time(), phase, status))
            if status == 202:
                acked.append((answer["first"], answer["last"]))


def logged_seqs():
    seqs, after = [], 0
    while True:
        status, body = get(f"/channels/news/changes?after={after}&limit=50000")
        assert status == 200, status
        page = [int(s) for s in re.findall(rb'<url>.*?ch:seq="(\d+)"', body, re.S)]
        if not page:
            return seqs
        seqs += page
        after = page[-1]


def check(what):
    want = set()
    for first, last in acked:
        want.update(range(first, last + 1))
    have = logged_seqs()
    missing = len(want - set(have))
    print(f"{what}: {len(want)} changes acknowledged, {len(have)} in the log, {missing} missing")


hub = start()
threads = [threading.Thread(target=worker, args=(w,)) for w in range(WORKERS)]
for t in threads:
    t.start()
time.sleep(3)

phase = "full"
with open(filler, "wb") as f:
    try:
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()
    except OSError:
        pass
full_at = time.time()
log_at_full = os.path.getsize(log_path)
ready_while_full = []
while time.time() < full_at + FULL:
    ready_while_full.append(get("/readyz")[0])
    time.sleep(1)
log_bytes = os.path.getsize(log_path) - log_at_full

phase = "after"
os.remove(filler)
freed_at = time.time()
first_ok = None
while time.time() < freed_at + AFTER:
    with lock:
        first_ok = first_ok or next((t for t, p, s in answers if p == "after" and s == 202), None)
    time.sleep(0.2)
stop.set()
for t in threads:
    t.join()

by_phase = collections.defaultdict(collections.Counter)
for _, p, s in answers:
    by_phase[p][s] += 1
for p in ("before", "full", "after"):
    print(f"{p:>6}: " + ", ".join(f"{s}×{n}" for s, n in sorted(by_phase[p].items())))
print(f"/readyz while full: {collections.Counter(ready_while_full)}")
print(f"log bytes while the disk was full ({FULL:.0f} s): {log_bytes}")
refused_after = sum(n for s, n in by_phase["after"].items() if s != 202)
print(f"writes refused after space returned: {refused_after}; first accepted "
      + (f"{first_ok - freed_at:.1f} s after" if first_ok else "never"))
check("without a restart")

hub.send_signal(signal.SIGKILL)
hub.wait()
hub = start()
check("after SIGKILL and a restart")
hub.terminate()
hub.wait()
subprocess.run(["umount", mount], check=True)
os.rmdir(mount)
print(f"hub log: {log_path}")
