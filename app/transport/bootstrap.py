"""Ship the worker to a node with nothing installed there: a payload of workers/**.py and a tiny first stage.

The first stage is passed as `python3 -c '<stage>'`: it checks the Python version, reads exactly N bytes of
payload from stdin, installs an in-memory importer for the `workers` package and calls
`workers.__main__.main(options)`; the worker then keeps using the same stdin for the protocol. Nothing is
written on the node unless a debug copy is asked for. No I/O here beyond reading the worker sources once.

The payload holds the same modules compiled by this interpreter (marshal) and, in a second zlib stream that
the node decompresses only when it needs a source (another Python, a traceback, the layout probe), the sources.
A node whose Python has the same bytecode magic (the same minor version: usually, as login and compute
nodes share an image) runs those and skips compiling ~190 KB of source, ~15 ms of CPU per worker start,
which matters on nodes whose cores the hung job keeps busy; any other Python compiles the sources. Of the
~495 KB payload (zlib), the compiled half is ~330 KB and the sources ~165 KB: ~4 ms on a 1 Gb/s link per node.
"""

from __future__ import annotations

import base64
import functools
import importlib.machinery
import importlib.util
import json
import marshal
import shlex
import sys
import threading
import types
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

# Exit codes the stage uses for its own failures, distinct from the shell's 126/127 and from Python's 1/2.
EXIT_OLD_PYTHON = 97
EXIT_SHORT_PAYLOAD = 98
# The first words of the stage's own stderr lines, so that the login side recognises them.
MARK_OLD_PYTHON = "hangscope-stage: old python"
MARK_SHORT_PAYLOAD = "hangscope-stage: short payload"

WORKERS_DIR = Path(__file__).resolve().parents[2] / "workers"
# How every stage's `-c` argument begins (binascii is built in: no base64.py to import first).
STAGE_PREFIX = "import binascii,zlib;exec("
# How the worker's interpreter is started unless --python says otherwise. -S: the worker needs only the
# standard library, and without site no sitecustomize or .pth hook of the node's Python runs first (one
# that prints would corrupt the protocol stream; all of them cost start-up time, ~2.5 ms on Debian).
DEFAULT_PYTHON = "python3 -S"
# Shipped as source only: the GPU test programs run under the job's own interpreter, whatever its version.
SOURCE_ONLY = ("workers.gputest",)
PAYLOAD_LEVEL = 6  # zlib level of the payload (build_payload)

# The stage must parse under any Python (2.7 included) so that the version check can run and report: no
# f-strings, no annotations, nothing newer than 2.7 syntax. It never writes files unless keep_dir is set.
_STAGE = r'''import sys
if sys.version_info<(3,9):
 sys.stderr.write("@MARK_OLD@ %s at %s; hangscope needs >= 3.9\n"%(sys.version.split()[0],sys.executable))
 sys.stderr.flush();sys.exit(@EXIT_OLD@)
if sys.path and sys.path[0]=="":
 del sys.path[0]
import json,zlib,importlib.machinery
n=@SIZE@
r=sys.stdin.buffer
b=b""
while len(b)<n:
 c=r.read(n-len(b))
 if not c:
  sys.stderr.write("@MARK_SHORT@ %d of %d bytes\n"%(len(b),n));sys.stderr.flush();sys.exit(@EXIT_SHORT@)
 b+=c
d=zlib.decompress(b[:@HEAD@])
i=d.index(b"\n")
M=json.loads(d[:i].decode("utf-8"))
C={}
try:
 import _frozen_importlib_external as E,marshal
 if E.MAGIC_NUMBER==@MAGIC@:
  C=marshal.loads(d[i+1:])
except Exception:
 C={}
O=json.loads(@OPTS@)
S=[]
def _src(n):
 if not S:
  S.append(json.loads(zlib.decompress(b[@HEAD@:]).decode("utf-8")))
 return S[0][n]
def _fn(n):
 return "<hangscope>/"+n.replace(".","/")+("/__init__.py" if M[n] else ".py")
class L(object):
 def find_spec(self,name,path=None,target=None):
  if name in M:
   return importlib.machinery.ModuleSpec(name,self,origin="<hangscope>/"+name,is_package=M[name])
 def create_module(self,spec):
  return None
 def exec_module(self,m):
  n=m.__spec__.name
  c=C.pop(n,None)
  exec(c if c is not None else compile(_src(n),_fn(n),"exec"),m.__dict__)
 def get_source(self,name):
  return _src(name)
sys.meta_path.insert(0,L())
@KEEP@import workers.__main__
sys.exit(workers.__main__.main(O) or 0)
'''

# Optional debug copy on the node: written only when asked for (keep_dir), private to the user.
_KEEP = r'''import os
for k in M:
 p=os.path.join(O["keep_dir"],*k.split("."))
 if M[k]:
  p=os.path.join(p,"__init__")
 os.makedirs(os.path.dirname(p),mode=0o700,exist_ok=True)
 with open(p+".py","w") as f:
  f.write(_src(k))
'''


@dataclass(frozen=True)
class Payload:
    """The compressed worker sources and the first stage that loads them."""

    data: bytes  # what is written to the worker's stdin before any request
    modules: tuple[str, ...]
    # data is two zlib streams: the first `head` bytes hold the module list and the compiled code, the rest the
    # sources, which the stage decompresses only when it needs one (another Python, a traceback, the probe)
    head: int
    magic: bytes = b""  # the bytecode magic of the compiled modules in data (this interpreter's)

    def stage(self, options: Optional[Mapping[str, Any]] = None) -> str:
        """The `-c` argument: base64 inside the shell's single quotes survives any login shell's quoting."""
        opts = dict(options or {})
        code = (_STAGE.replace("@MARK_OLD@", MARK_OLD_PYTHON).replace("@EXIT_OLD@", str(EXIT_OLD_PYTHON))
                .replace("@MARK_SHORT@", MARK_SHORT_PAYLOAD).replace("@EXIT_SHORT@", str(EXIT_SHORT_PAYLOAD))
                .replace("@SIZE@", str(len(self.data))).replace("@HEAD@", str(self.head))
                .replace("@MAGIC@", repr(self.magic))
                .replace("@OPTS@", repr(json.dumps(opts, sort_keys=True)))
                .replace("@KEEP@", _KEEP if opts.get("keep_dir") else ""))
        packed = base64.b64encode(zlib.compress(code.encode("ascii"), 9)).decode("ascii")
        return STAGE_PREFIX + 'zlib.decompress(binascii.a2b_base64("%s")))' % packed


def _module_name(rel: Path) -> tuple[str, bool]:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _pack(root: Path = WORKERS_DIR) -> Payload:
    """Pack every `<root>/**/*.py` (root is the `workers` package) into one payload (uncached)."""
    modules: dict[str, list[Any]] = {}
    paths: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent)
        if "__pycache__" in rel.parts:
            continue
        name, is_pkg = _module_name(rel)
        modules[name] = [is_pkg, path.read_text(encoding="utf-8")]
        paths[name] = path
    # A directory of modules without __init__.py is still importable as a package on the node.
    for name in list(modules):
        parts = name.split(".")
        for i in range(1, len(parts)):
            modules.setdefault(".".join(parts[:i]), [True, ""])
    names = json.dumps({name: is_pkg for name, (is_pkg, _) in modules.items()}, sort_keys=True).encode("ascii")
    code = {name: _code(name, is_pkg, src, paths.get(name))
            for name, (is_pkg, src) in modules.items() if not name.startswith(SOURCE_ONLY)}
    sources = json.dumps({name: src for name, (_, src) in modules.items()}, sort_keys=True,
                         ensure_ascii=True).encode("ascii")
    # Two streams: the node decompresses and parses the sources (~560 KB, ~5-7 ms of a worker's start) only
    # when it needs one. Level 6, not 9: 1.3 MB packs in ~40 ms instead of ~140 ms (every CLI run pays it
    # before the first worker starts) for 0.8% more bytes (~4 KB a node).
    head = zlib.compress(names + b"\n" + marshal.dumps(code), PAYLOAD_LEVEL)
    return Payload(data=head + zlib.compress(sources, PAYLOAD_LEVEL), modules=tuple(sorted(modules)),
                   magic=importlib.util.MAGIC_NUMBER, head=len(head))


def _code(name: str, is_pkg: bool, src: str, path: Optional[Path]) -> types.CodeType:
    """A shipped module's code object, named as the node's tracebacks show it (module_filename). Read from
    Python's own bytecode cache beside the source where it is current (an installed hangscope has one; Python
    writes it on first use unless bytecode writing is off), compiled otherwise: compiling every worker module
    cost ~140 ms of login CPU on every run."""
    filename = module_filename(name, is_pkg)
    code: Optional[types.CodeType] = None
    if path is not None and not sys.flags.optimize:
        try:
            code = importlib.machinery.SourceFileLoader(name, str(path)).get_code(name)
        except (OSError, SyntaxError, ImportError, ValueError):
            code = None
    if code is None:
        return compile(src, filename, "exec", dont_inherit=True, optimize=0)
    return _renamed(code, filename)


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


_packed = functools.lru_cache(maxsize=4)(_pack)
_BUILDING = threading.Lock()  # one build at a time: a caller that finds prebuild_payload's thread at it waits
_BUILT: set = set()


@functools.wraps(_pack)  # __wrapped__: the uncached _pack
def build_payload(root: Path = WORKERS_DIR) -> Payload:
    """Pack every `<root>/**/*.py` (root is the `workers` package) into one payload; built once, cached."""
    with _BUILDING:
        payload = _packed(root)
        _BUILT.add(root)
        return payload


def prebuild_payload(root: Path = WORKERS_DIR) -> None:
    """Start build_payload in a daemon thread, so that the ~0.1 s of CPU it costs overlaps the first
    connections' TCP and key exchange instead of holding up the first worker start; a build_payload call
    then waits for it (or builds it itself, and raises, if the thread could not)."""
    if root in _BUILT:
        return

    def build() -> None:
        try:
            build_payload(root)
        except Exception:  # the worker start that needs it builds it again and says why it fails
            pass

    threading.Thread(target=build, name="hangscope-payload", daemon=True).start()


def module_filename(name: str, is_pkg: bool) -> str:
    """The file name tracebacks show for a shipped module (the stage's _fn gives the same)."""
    return "<hangscope>/" + name.replace(".", "/") + ("/__init__.py" if is_pkg else ".py")


def python_argv(python: str) -> list[str]:
    """`--python` may carry flags (`python3 -I -S`): split it like a shell would, never run it through one."""
    words = shlex.split(python)
    if not words:
        raise ValueError("empty python command")
    return words


def remote_command(python: str, stage: str) -> str:
    """The command line an SSH server hands to the user's login shell; every word is quoted."""
    return "exec " + " ".join(shlex.quote(w) for w in python_argv(python)) + " -c " + shlex.quote(stage)
