#!/usr/bin/env python3
"""How much a closed Change List read on a cache miss leaves resident: the quiet probe of
docs/performance.md (forty-fifth and forty-sixth passes).

Usage:
    python3 scripts/closed_list_rss.py target/release/changehub [SEED]

Serves the hub on a free loopback port with `--cache-size 64 --retain-changes 150000` (the
steady run's settings), pushes 160,000 changes in NDJSON requests of 5,000, waits 3 s, then
once a second reads a closed list of 10,000 changes picked at random (SEED, default 1) from the
retained ones, 40 times, sampling the hub's VmRSS every 5 ms. For reads 11 to 40 (the caches
full by then) it prints the rise from just before each read to the highest sample within its
second: summed, and those of 2.7 MiB or more. Stops the hub at the end; its data folder is a
temporary one."""
import random, sys, threading, time, urllib.request

import probe_hub

BIN = sys.argv[1]
SEED = int(sys.argv[2]) if len(sys.argv) > 2 else 1
CHANGES, REQUEST, LIST, READS, SKIPPED = 160_000, 5_000, 10_000, 40, 10


def main():
    with probe_hub.hub(BIN, 64) as (process, base, _folder):
        run(process, base)


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("the hub is gone")


def run(hub, base):
    probe_hub.fill(base, CHANGES, REQUEST)
    rnd = random.Random(SEED)
    retained_lists = (CHANGES - 150_000) // LIST + 1  # the first list still retained
    rises = []
    for k in range(READS):
        first = rnd.randrange(retained_lists, CHANGES // LIST) * LIST + 1
        url = f"{base}/channels/c/changelist/{first}-{first + LIST - 1}.xml"
        reader = threading.Thread(target=lambda: urllib.request.urlopen(url, timeout=10).read())
        before = peak = rss(hub.pid)
        second = time.time() + 1.0
        reader.start()
        while time.time() < second:
            peak = max(peak, rss(hub.pid))
            time.sleep(0.005)
        reader.join()
        if k >= SKIPPED:
            rises.append(max(peak - before, 0.0))
    large = [round(r, 1) for r in rises if r >= 2.7]
    print(f"seed {SEED}: reads {SKIPPED + 1}-{READS}: summed rise {sum(rises):.1f} MiB; "
          f"{len(large)} rises of 2.7 MiB or more {large}; RSS at the end {rss(hub.pid):.1f} MiB")


main()
