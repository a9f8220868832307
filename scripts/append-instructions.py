#!/usr/bin/env python3
"""How many instructions Redis spends on one call of the append script, counted by callgrind.

Timing the append script on a shared machine moves by a third between runs; instruction
counts do not. This starts a private redis-server under `valgrind --tool=callgrind` (on
127.0.0.1, a free port, nothing saved), loads the append script as the store loads it
(`feedsync.lua`, then `append.lua`), calls it WARM times with the same 1,000 changes (as
figure 4a of the benchmark sends them: the same 1,000 resources each time, one publisher),
then counts the instructions of CALLS more calls, each updating the items the one before
wrote, and prints the count per call.

    python3 scripts/append-instructions.py [SCRIPT_DIR] [--calls N] [--warm N] [--cpu]
                                           [--requests R]

SCRIPT_DIR defaults to src/store/redis/scripts: point it at a copy to weigh a variant.
Needs valgrind (`apt-get install -y valgrind`) and redis-server. Takes about 10 s.

With --requests R, each call holds R requests of one change each, all of one resource (as
the group commit gathers figure 4b's one-change requests: about 22 per call on two CPUs).

With --cpu, redis-server runs without valgrind and the script prints the CPU time Redis
spent per call instead (from /proc, in clock ticks: give it 1,000 calls or more, and
alternate the variants, as the machine's noise is of the order of what is measured).
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time


def command(*args):
    """One command in RESP."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


def reply(f):
    """One RESP reply, read from file `f`."""
    line = f.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind in (b"+", b":"):
        return rest
    if kind == b"$":
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if kind == b"*":
        return [reply(f) for _ in range(int(rest))]
    raise RuntimeError(f"unexpected reply {line!r}")


def cpu_seconds(pid):
    """User and system CPU of process `pid` so far, in seconds."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "scripts", nargs="?", default=os.path.join(here, "..", "src/store/redis/scripts")
    )
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--warm", type=int, default=2)
    parser.add_argument("--requests", type=int, default=0,
                        help="calls of this many one-change requests instead of one of 1,000")
    parser.add_argument("--cpu", action="store_true",
                        help="time Redis's CPU per call instead of counting instructions")
    opts = parser.parse_args()
    source = b"".join(
        open(os.path.join(opts.scripts, name), "rb").read()
        for name in ("feedsync.lua", "append.lua")
    )

    work = tempfile.mkdtemp()
    out = os.path.join(work, "callgrind.out")
    port = free_port()
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                f"--callgrind-out-file={out}"]
    server = subprocess.Popen(
        ([] if opts.cpu else valgrind) + [
         "redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "",
         "--appendonly", "no", "--dir", work],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("redis-server did not start under valgrind")
                time.sleep(0.1)
        f = conn.makefile("rb")

        def call(*args):
            conn.sendall(command(*args))
            return reply(f)

        sha = call("SCRIPT", "LOAD", source)
        keys = [f"changehub:{{bench}}:{k}" for k in
                ("log", "meta", "idem", "idem-at", "res", "res-seq", "sx", "sx-conflicts")]
        # A datetime key (see log.rs): nanoseconds since the epoch + 10^21, 23 digits.
        key = "%023d" % (1_700_000_000 * 10**9 + 10**21)
        locs = [f"http://example.com/resource/{i}" for i in range(1000)]
        entries = [
            key + '{"loc":"%s","change":"updated","hash":"md5:1e0d5cb8ef6ba40c99b14c0237be735e",'
            '"length":1234,"type":"text/plain","source":"bench"}' % loc
            for loc in locs
        ]
        if opts.requests:
            # R requests of one change each: key, fingerprint, now, 1 change, in order.
            entries, locs = entries[:1] * opts.requests, locs[:1] * opts.requests
            heads = ["", "", 1_700_000_000, 1, "1"] * opts.requests
            args = ["EVALSHA", sha, len(keys), *keys, 86400, "changehub:events", "bench",
                    opts.requests, *heads, *entries, *locs]
        else:
            args = ["EVALSHA", sha, len(keys), *keys, 86400, "changehub:events", "bench", 1,
                    "", "", 1_700_000_000, len(entries), "1", *entries, *locs]
        # Last, the epoch the channel takes on its first append.
        args.append("0123456789abcdef")

        def append():
            answer = call(*args)
            if answer[0] != b"0":
                sys.exit(f"the append script answered {answer}")

        def instrument(on):
            if not opts.cpu:
                subprocess.run(["callgrind_control", "-i", on, str(server.pid)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)

        for _ in range(opts.warm):
            append()
        instrument("on")
        started = cpu_seconds(server.pid)
        for _ in range(opts.calls):
            append()
        spent = cpu_seconds(server.pid) - started
        instrument("off")
        item = call("HGET", keys[6], locs[0])
    finally:
        server.terminate()
        server.wait()
    what = f"{opts.requests} one-change requests" if opts.requests else "1,000 changes"
    if opts.cpu:
        print(f"{spent / opts.calls * 1000:.2f} ms of Redis CPU per call of {what} "
              f"(the first item afterwards: {(item or b'').decode()!r})")
        return
    total = 0
    for name in os.listdir(work):
        if name.startswith("callgrind.out"):
            for line in open(os.path.join(work, name)):
                if line.startswith(("summary:", "totals:")):
                    total = max(total, int(line.split()[1]))
    print(f"{total / opts.calls / 1e6:.2f}M instructions per call of {what} "
          f"(the first item afterwards: {(item or b'').decode()!r})")


if __name__ == "__main__":
    main()
