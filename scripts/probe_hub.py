"""What the closed-list probes share (`closed_list_rss.py`, `closed_list_misses.py`): a hub
on a free loopback port with a temporary data folder, and its log filled with changes."""
import contextlib, json, socket, subprocess, tempfile, time, urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def hub(binary, cache_mib):
    """Serves channel `c` (token `token`) with `--cache-size cache_mib --retain-changes
    150000`; yields (process, base URL, data folder) once it answers, stops it afterwards."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    data = tempfile.TemporaryDirectory()
    process = subprocess.Popen(
        [binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data.name + "/data",
         "--channel", "c=token", "--cache-size", str(cache_mib), "--retain-changes", "150000",
         "--max-body", str(64 << 20)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/channels/c/changelist.xml", timeout=1).read()
                break
            except OSError:
                if time.time() > deadline:
                    raise RuntimeError("the hub did not start within 30 s")
                time.sleep(0.05)
        yield process, base, data.name
    finally:
        process.terminate()
        process.wait()


def fill(base, changes, request):
    """Pushes `changes` changes, each to a resource of its own, in NDJSON requests of
    `request`, then waits 3 s (the last batch published, the block files written)."""
    for start in range(0, changes, request):
        body = "\n".join(
            json.dumps({"loc": f"http://example.com/r/{n}", "change": "updated",
                        "hash": "md5:1e0d5cb8ef6ba40c99b14c0237be735e", "length": 1000 + n % 5000})
            for n in range(start, start + request))
        post = urllib.request.Request(
            base + "/channels/c/changes", data=body.encode(), method="POST",
            headers={"Authorization": "Bearer token", "Content-Type": "application/x-ndjson"})
        urllib.request.urlopen(post, timeout=60).read()
    time.sleep(3)
