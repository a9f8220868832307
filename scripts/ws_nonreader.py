#!/usr/bin/env python3
"""Hub memory held by websocket clients that subscribe to everything and read nothing.

Usage: python3 scripts/ws_nonreader.py target/release/changehub [CHANGES] [CLIENTS]

Starts the hub on a free loopback port with a fresh data folder, pushes CHANGES changes
(default 200000), opens CLIENTS raw websocket connections (default 3) with 4 KiB receive
buffers that subscribe with since=0 and never read, and prints how much the hub's resident
memory grew over 20 s. Everything stays on 127.0.0.1."""
import socket, os, json, time, base64, struct, subprocess, sys, urllib.request
BIN=sys.argv[1]
N=int(sys.argv[2]) if len(sys.argv) > 2 else 200000
CLIENTS=int(sys.argv[3]) if len(sys.argv) > 3 else 3
probe=socket.socket(); probe.bind(("127.0.0.1",0)); port=probe.getsockname()[1]; probe.close()
data=f"/tmp/changehub-ws-nonreader-{os.getpid()}"
p=subprocess.Popen([BIN,"serve","--listen",f"127.0.0.1:{port}","--channel","news=t","--data-dir",data],stderr=subprocess.DEVNULL)
for _ in range(100):
    try: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz"); break
    except Exception: time.sleep(0.1)
for start in range(0,N,5000):
    body=json.dumps([{"loc":f"http://example.com/r/{i}","change":"updated","hash":"md5:1e0d5cb8ef6ba40c99b14c0237be735e","length":1234,"type":"text/plain"} for i in range(start,min(N,start+5000))]).encode()
    req=urllib.request.Request(f"http://127.0.0.1:{port}/channels/news/changes",data=body,headers={"Authorization":"Bearer t","Content-Type":"application/json"})
    urllib.request.urlopen(req).read()
time.sleep(1)
def rss(): 
    for l in open(f"/proc/{p.pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1])
before=rss()
socks=[]
for c in range(CLIENTS):
    s=socket.create_connection(("127.0.0.1",port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    key=base64.b64encode(os.urandom(16)).decode()
    s.sendall(f"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode())
    resp=b""
    while b"\r\n\r\n" not in resp: resp+=s.recv(1)
    payload=json.dumps({"op":"subscribe","channel":"news","since":0}).encode()
    mask=os.urandom(4)
    frame=bytes([0x81,0x80|len(payload)])+mask+bytes(b^mask[i%4] for i,b in enumerate(payload))
    s.sendall(frame)
    socks.append(s)
peak=before
t0=time.time()
while time.time()-t0<20:
    time.sleep(1); peak=max(peak,rss())
print(f"N={N} clients={CLIENTS} rss before={before/1024:.1f}MiB peak={peak/1024:.1f}MiB added={(peak-before)/1024:.1f}MiB per client={(peak-before)/1024/max(CLIENTS,1):.1f}MiB")
closed=0
for s in socks:
    s.settimeout(0.5)
    try:
        # drain quickly to see whether it was closed
        got=s.recv(65536)
    except Exception: pass
p.terminate(); p.wait()
subprocess.run(["rm","-rf",data])
