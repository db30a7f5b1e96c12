import threading, time, os, sys
from dataclasses import dataclass

@dataclass
class Cfg:
    host: str
    password: str

class Cli:
    def __repr__(self): return "Cli(token='x')"

def bg(ev):
    upload_header = {"Authorization": "Bearer PROBE_bg_token_value"}
    return ev.wait()

def inner(ev):
    s_short = "PROBE_short"
    s_long = "L" * 50 + "PROBE_middle" + "M" * 100 + "PROBE_tail"
    s_nl = "line1\nPROBE_after_newline\r\n"
    s_uni = "密码: PROBE_uni пароль"
    d = {"user": "u", "wachtwoord": "PROBE_dict_val", "n": 5}
    d_big = {"k%d" % i: "v" * 20 for i in range(10)}
    nested = {"a": {"b": [{"c": "PROBE_nested"}]}}
    lst = [("Authorization", "Basic PROBE_tuple"), ("X", "y")]
    ints = [104, 102, 95, 65]
    b = b"PROBE_bytes\x00\r\n"
    ba = bytearray(b"PROBE_ba")
    st = {"PROBE_set"}
    num = 80417263
    big = 2**80
    fl = 0.000123
    tup = (8, 128)
    cfg = Cfg("h", "PROBE_dc_pw")
    cli = Cli()
    none = None
    esc = 'a"b\'c\\d\tPROBE_esc'
    return ev.wait()

def outer(ev):
    step = 1200
    return inner(ev)

ev = threading.Event()
threading.Thread(target=bg, args=(ev,), name="uploader-PROBE_tname", daemon=True).start()
print("ready", os.getpid(), flush=True)
outer(ev)
