"""Helper processes of the hostile-text set, each with hostile text in its own command line (the trailing args):
  peer.py tcp PORT ...       a local service that accepts and never answers (a rank's recv waits on it)
  peer.py unix PATHHEX ...   the same on a unix socket whose path is hostile
  peer.py flock PATHHEX ...  holds a flock on a file whose path is hostile
  peer.py launch SPEC ...    a torchrun stand-in: starts the rank (python3 rank.py) as its child and waits
"""
import fcntl, os, socket, subprocess, sys, time

mode, arg = sys.argv[1], sys.argv[2]
if mode == "tcp":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", int(arg))); s.listen(8)
    conns = []
    while True:
        c, _ = s.accept(); conns.append(c)
elif mode == "unix":
    s = socket.socket(socket.AF_UNIX); s.bind(bytes.fromhex(arg)); s.listen(8)
    conns = []
    while True:
        c, _ = s.accept(); conns.append(c)
elif mode == "flock":
    fh = open(bytes.fromhex(arg), "ab"); fcntl.flock(fh, fcntl.LOCK_EX)
    while True:
        time.sleep(3600)
elif mode == "launch":
    env = dict(os.environ)
    script = os.environ.get("HZRANKSCRIPT") or os.path.join(os.path.dirname(os.path.realpath(__file__)), "rank.py")
    p = subprocess.Popen([sys.executable, script], env=env)
    p.wait()
