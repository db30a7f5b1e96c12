"""The node side of the srun transport: a tiny multiplexer that runs one worker per srun task.

srun gives every task the same stdin and merges every task's stdout into one stream, splitting (and so
interleaving) lines longer than about 1 KB. So both directions are framed in short lines (measured on SLURM
22.05: 1,000-byte lines arrive whole, 4,000-byte lines interleave between nodes):

- node -> login: `<task> <kind> <base64>` lines of at most FRAME_LINE bytes; kinds: H the node's name (first),
  O worker stdout, E worker stderr, X the worker's exit status (decimal).
- login -> node: the worker payload once (raw, N bytes, to every task), then `<task> D <base64>` (bytes for that
  task's worker), `<task> E` (EOF on its stdin: the worker stops its tools and exits), `<task> K` (EOF, then
  kill after a grace period). EOF on srun's stdin is `E` for every task.

The stage keeps the bootstrap's rules: python >= 3.9 checked by the worker stage itself, nothing written on the
node, the worker's own first stage unchanged (it reads the payload from its stdin).
"""

from __future__ import annotations

import base64
import json
import zlib
from typing import Sequence

FRAME_RAW = 720  # bytes of data per frame: base64 -> 960 chars, plus "<task> O " stays under 1,000 bytes
KILL_GRACE = 3.0  # seconds a worker has after EOF on a `K` before it is killed

_MUX = r'''import os,sys,base64,json,socket,subprocess,threading,signal
P=os.environ.get("SLURM_PROCID","0")
H=os.environ.get("SLURMD_NODENAME") or socket.gethostname()
N=@SIZE@
A=json.loads(@ARGV@)
o=sys.stdout.buffer
L=threading.Lock()
def emit(k,d=b""):
 with L:
  i=0
  while True:
   o.write(("%s %s "%(P,k)).encode()+base64.b64encode(d[i:i+@FRAME@])+b"\n")
   i+=@FRAME@
   if i>=len(d):
    break
  o.flush()
emit("H",H.encode("utf-8","replace"))
r=sys.stdin.buffer
b=b""
while len(b)<N:
 c=r.read(N-len(b))
 if not c:
  sys.exit(98)
 b+=c
w=subprocess.Popen(A,stdin=subprocess.PIPE,stdout=subprocess.PIPE,stderr=subprocess.PIPE)
def put(d):
 try:
  w.stdin.write(d);w.stdin.flush()
 except Exception:
  pass
def end(grace):
 try:
  w.stdin.close()
 except Exception:
  pass
 if grace is not None:
  t=threading.Timer(grace,lambda:w.poll() is None and w.kill());t.daemon=True;t.start()
put(b)
def pump(f,k):
 while True:
  d=os.read(f.fileno(),65536)
  if not d:
   return
  emit(k,d)
T=[threading.Thread(target=pump,args=(w.stdout,"O")),threading.Thread(target=pump,args=(w.stderr,"E"))]
for t in T:
 t.daemon=True;t.start()
def feed():
 me=P.encode()
 for line in r:
  p=line.rstrip(b"\n").split(b" ")
  if p[0]!=me or len(p)<2:
   continue
  if p[1]==b"D" and len(p)>2:
   put(base64.b64decode(p[2]))
  elif p[1]==b"E":
   return end(None)
  elif p[1]==b"K":
   return end(@GRACE@)
 end(@GRACE@)
f=threading.Thread(target=feed);f.daemon=True;f.start()
signal.signal(signal.SIGTERM,lambda s,fr:end(@GRACE@))
c=w.wait()
for t in T:
 t.join(5)
emit("X",str(c).encode())
'''


def mux_stage(worker_argv: Sequence[str], payload_size: int) -> str:
    """The `-c` argument that runs on every node of the srun step; worker_argv is `python3 -c <stage>`."""
    code = (_MUX.replace("@SIZE@", str(payload_size)).replace("@ARGV@", repr(json.dumps(list(worker_argv))))
            .replace("@FRAME@", str(FRAME_RAW)).replace("@GRACE@", repr(KILL_GRACE)))
    packed = base64.b64encode(zlib.compress(code.encode("ascii"), 9)).decode("ascii")
    return 'import base64,zlib;exec(zlib.decompress(base64.b64decode("%s")))' % packed


def frame(task: int, kind: str, data: bytes = b"") -> bytes:
    """One login -> node line."""
    if kind == "D":
        return b"%d D %s\n" % (task, base64.b64encode(data))
    return b"%d %s\n" % (task, kind.encode("ascii"))
