#!/usr/bin/env python3
"""What a closed Change List read costs the hub when it is not kept rendered: the miss probe of
docs/performance.md (forty-seventh pass).

Usage:
    python3 scripts/closed_list_misses.py target/release/changehub [CACHE_MIB] [SECONDS]

Serves the hub on a free loopback port with `--cache-size CACHE_MIB` (default 16: the rendered
documents get 2 MiB of it, less than one closed list of 10,000 changes, so every read renders)
and `--retain-changes 150000`, pushes 160,000 changes in NDJSON requests of 5,000, waits 3 s,
then has `wrk` (4 connections, SECONDS, default 8) read the first 15 closed lists in random
order. Prints the reads per second and the hub's CPU per read (from /proc). Compare two
binaries in alternating runs: the rate moves with the machine, the CPU per read much less.
Needs wrk (`bash scripts/apt-install.sh wrk`). Stops the hub at the end; its data folder is a
temporary one."""
import os, subprocess, sys, urllib.request

import probe_hub

BIN = sys.argv[1]
CACHE = sys.argv[2] if len(sys.argv) > 2 else "16"
SECONDS = sys.argv[3] if len(sys.argv) > 3 else "8"
CHANGES, REQUEST, LIST, LISTS = 160_000, 5_000, 10_000, 15


def main():
    with probe_hub.hub(BIN, CACHE) as (process, base, folder):
        run(process, base, folder)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(hub, base, folder):
    probe_hub.fill(base, CHANGES, REQUEST)
    # The lists still retained (the first 10,000 changes are past --retain-changes).
    paths = [f"/channels/c/changelist/{k * LIST + 1}-{(k + 1) * LIST}.xml"
             for k in range(1, LISTS + 1)]
    for path in paths:
        urllib.request.urlopen(base + path, timeout=10).read()
    script = os.path.join(folder, "closed.lua")
    with open(script, "w") as f:
        f.write("local paths = {" + ", ".join(f'"{p}"' for p in paths) + "}\n"
                "request = function() return wrk.format('GET', paths[math.random(#paths)]) end\n")
    before = cpu_seconds(hub.pid)
    out = subprocess.run(["wrk", "-t1", "-c4", f"-d{SECONDS}s", "-s", script, base + "/"],
                         capture_output=True, text=True, check=True).stdout
    used = cpu_seconds(hub.pid) - before
    reads = int(next(l for l in out.splitlines() if "requests in" in l).split()[0])
    rate = float(next(l for l in out.splitlines() if l.startswith("Requests/sec")).split()[1])
    errors = [l.strip() for l in out.splitlines() if "Non-2xx" in l or "Socket errors" in l]
    print(f"{os.path.basename(BIN)}, --cache-size {CACHE}: {rate:.0f} reads/s, {reads} reads, "
          f"the hub {1000 * used / reads:.2f} ms of CPU per read {' '.join(errors)}")


main()
