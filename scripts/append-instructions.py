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
                                           [--requests R] [--prepared [--no-index] [--no-items]]
                                           [--inline | --fold-every K [--kept]]

SCRIPT_DIR defaults to src/store/redis/scripts: point it at a copy to weigh a variant.
Needs valgrind (`apt-get install -y valgrind`) and redis-server. Takes about 10 s.

The append script writes the log alone while no FeedSync item carries conflicts; the hub
brings the resource index and the items up to the log later (src/store/redis/fold.rs). With
--fold-every K, every K calls are followed by what that costs Redis as the hub does it: the
range reads of the K calls' entries, one HMGET of their items and one call of `fold.lua`
(the counts are then per call, the fold's share included; give --calls a multiple of K); with
--kept as well, without the range reads, as when the hub folds the entries it kept of its own
appends. With --inline, a conflict on a
resource the calls never touch makes every call write the index and the items itself, as
every append did before the fold existed.

With --requests R, each call holds R requests of one change each, all of one resource (as
the group commit gathers figure 4b's one-change requests: about 22 per call on two CPUs).

With --prepared, the append script is replaced by the cheapest one the store's layout allows
(PREPARED below): as if the hub had worked out every value itself (seqs, chunks, the index's
entries, the FeedSync items, after reading the items with one HMGET, which is counted too) and
the script only checked the channel's `last` and wrote. What it counts is a ceiling for any
script over the same keys, not a design: --prepared --no-index and --prepared --no-items leave
the resource index or the FeedSync items out as well.

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


# The --prepared script. ARGV: the `last` the hub expects, the number of changes N, the new
# latest datetime key, the new `last`, then N entries, N locs, N seqs and N FeedSync items;
# ARGV[5] and ARGV[6] say whether to write the index and the items ('1') or not ('0').
PREPARED = b"""
local call, unpack = redis.call, unpack
if (call('HGET', KEYS[2], 'last') or '0') ~= ARGV[1] then return {-1} end
local n = ARGV[2] + 0
local e0, l0, i0, s0 = 6, 6 + n, 6 + 2 * n, 6 + 3 * n
local t = {}
for c = 0, n - 1, 32 do
  local k, top = 0, math.min(c + 32, n)
  for i = c + 1, top do t[k + 1] = 'c'; t[k + 2] = ARGV[e0 + i]; k = k + 2 end
  call('XADD', KEYS[1], ARGV[i0 + c + 1], unpack(t, 1, k))
end
for c = 0, n - 1, 500 do
  local top, a, b, m = math.min(c + 500, n), {}, {}, 0
  if ARGV[5] == '1' then
    for i = c + 1, top do
      local loc = ARGV[l0 + i]
      a[m + 1] = loc; a[m + 2] = ARGV[e0 + i]; b[m + 1] = ARGV[i0 + i]; b[m + 2] = loc
      m = m + 2
    end
    call('HSET', KEYS[5], unpack(a, 1, m))
    call('ZADD', KEYS[6], unpack(b, 1, m))
  end
  if ARGV[6] == '1' then
    m = 0
    for i = c + 1, top do a[m + 1] = ARGV[l0 + i]; a[m + 2] = ARGV[s0 + i]; m = m + 2 end
    call('HSET', KEYS[7], unpack(a, 1, m))
  end
end
call('HSET', KEYS[2], 'last', ARGV[4], 'dt', ARGV[3])
call('PUBLISH', 'changehub:events', 'head bench ' .. ARGV[4])
return {0}
"""


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
    parser.add_argument("--prepared", action="store_true",
                        help="count the cheapest script over the same keys (see above)")
    parser.add_argument("--no-index", action="store_true", help="with --prepared")
    parser.add_argument("--no-items", action="store_true", help="with --prepared")
    parser.add_argument("--fold-every", type=int, default=0,
                        help="count the hub's fold of the index after every K calls")
    parser.add_argument("--kept", action="store_true",
                        help="with --fold-every: the entries come from the hub's memory")
    parser.add_argument("--inline", action="store_true",
                        help="make the append script write the index and the items itself")
    opts = parser.parse_args()
    if opts.prepared and opts.requests:
        sys.exit("--prepared counts calls of 1,000 changes only")
    if opts.prepared and (opts.fold_every or opts.inline):
        sys.exit("--prepared writes the index itself: no --fold-every or --inline")
    if opts.inline and opts.fold_every:
        sys.exit("--inline leaves nothing to fold")
    source = PREPARED if opts.prepared else b"".join(
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
        fold_sha = call("SCRIPT", "LOAD", open(os.path.join(opts.scripts, "fold.lua"), "rb").read())
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
            entries, locs = entries[:1] * opts.requests, locs[:1] * opts.requests
        # The hub sends the locs only to a script that writes the index inline (log.rs).
        sent_locs = locs if opts.inline else []
        if opts.requests:
            # R requests of one change each: key, fingerprint, now, 1 change, in order.
            heads = ["", "", 1_700_000_000, 1, "1"] * opts.requests
            args = ["EVALSHA", sha, len(keys), *keys, 86400, "changehub:events", "bench",
                    opts.requests, *heads, *entries, *sent_locs]
        else:
            args = ["EVALSHA", sha, len(keys), *keys, 86400, "changehub:events", "bench", 1,
                    "", "", 1_700_000_000, len(entries), "1", *entries, *sent_locs]
        # Last, the epoch the channel takes on its first append.
        args.append("0123456789abcdef")

        if opts.inline:
            call("ZADD", keys[7], 0, "http://example.com/elsewhere")

        updates = [0]
        appended = [0]

        def fold():
            # As fold.rs does it: the entries after `folded` read (the chunk holding the first,
            # then the rest), the items read, each resource written once.
            last, folded = call("HMGET", keys[1], "last", "folded")
            if folded is None or int(folded) >= int(last):
                return
            start, end = int(folded) + 1, int(last)
            after = None
            if not opts.kept:
                holder = call("XREVRANGE", keys[0], f"{start}-0", "-", "COUNT", 1)
                after = holder[0][0] if holder else None
            while not opts.kept:
                got = call("XRANGE", keys[0], f"({after.decode()}" if after else f"{start}-0",
                           f"{end}-0", "COUNT", 256)
                if not got:
                    break
                after = got[-1][0]
            call("HMGET", keys[6], *locs)
            count = appended[0] * (len(entries) // len(set(locs)))
            args = []
            for i, loc in enumerate(dict.fromkeys(locs)):
                args += [loc, entries[i], end - len(entries) + 1 + i, f"{count} bench", ""]
            written = call("EVALSHA", fold_sha, 5, keys[1], keys[4], keys[5], keys[6], keys[7],
                           folded, end, len(args) // 5, *args)
            if written != b"1":
                sys.exit(f"the fold script answered {written}")

        def prepared_args():
            # What the hub would read and work out before the call: the items, then each
            # change's seq and its item's next count.
            call("HMGET", keys[6], *locs)
            last = updates[0] * len(entries)
            updates[0] += 1
            seqs = [str(last + 1 + i) for i in range(len(entries))]
            items = [f"{updates[0]} bench"] * len(entries)
            flags = ["0" if opts.no_index else "1", "0" if opts.no_items else "1"]
            return ["EVALSHA", sha, len(keys), *keys, str(last), len(entries), key,
                    str(last + len(entries)), *flags, *entries, *locs, *seqs, *items]

        def append():
            answer = call(*(prepared_args() if opts.prepared else args))
            if answer[0] != b"0":
                sys.exit(f"the append script answered {answer}")
            appended[0] += 1
            if opts.fold_every and appended[0] % opts.fold_every == 0:
                fold()

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
