"""Structure for the tool output that has none: what strace and gdb print of a process's bytes is never text.

strace: a diagnosis needs the syscall, its fd, sizes, flags, result and time, never the bytes a call read or
wrote (they are whatever the job sends: credentials, protocol logins, JSON bodies). Every string argument of a
call becomes `""...`, except a path where the call takes one (openat, stat, execve's program, a socket's
`sun_path`). With --strace-data the string keeps its *protocol verb* only, when it starts with one (`"AUTH"...`,
`"GET"...`, `"+OK"...`, `"HTTP/1.1"...`: letters in capitals, a word by the default-deny rule), never what
follows it.

gdb: a `char *` argument or a buffer is printed as its address and its text (`buf=0x7ffd "AUTH x"`): the text
becomes its size (`buf=0x7ffd <21 bytes>`). Thread names in gdb's thread headers stay (they are names, and go
through the same rules as every thread name).

Used on the node (workers/collect/traced.py) and again on the login side (app/report/share.py) for snapshots that
an older worker wrote.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: see workers/__init__.py
    from typing import Callable, Dict, Optional

from workers.cleartext import clear_word
from workers.lazyre import lazy

# strace's string argument: "..." with C escapes, then `...` when cut at -s
_STRACE_STRING = lazy(r'"(?:[^"\\\n]|\\.)*"(?:\.\.\.)?')
_CALL = lazy(r"^(?:\[pid\s+\d+\]\s+)?(?:\d\d:\d\d:\d\d\.\d+\s+)?(?:<\.\.\. (?P<resumed>[a-z_][a-z0-9_]*) "
             r"resumed>|(?P<call>[a-z_][a-z0-9_]*)\()")
# Calls whose first string argument is a path (strace prints it in full, whatever -s says).
_PATH_CALLS = frozenset({
    "open", "openat", "openat2", "creat", "stat", "lstat", "newfstatat", "fstatat64", "statx", "access", "faccessat",
    "faccessat2", "readlink", "readlinkat", "unlink", "unlinkat", "mkdir", "mkdirat", "rmdir", "rename", "renameat",
    "renameat2", "chdir", "chmod", "fchmodat", "chown", "lchown", "fchownat", "execve", "execveat", "link", "linkat",
    "symlink", "symlinkat", "truncate", "utimensat", "inotify_add_watch", "statfs", "getxattr", "lgetxattr",
    "setxattr", "listxattr", "mknod", "mknodat", "chroot", "umount2", "mount", "name_to_handle_at", "utime",
    "utimes", "futimesat", "swapon", "swapoff", "acct"})
_VERB = lazy(r"[+\-]?[A-Z][A-Z0-9_./-]{1,15}")
_VERB_END = lazy(r"[ \t]|\\[rnt0]|\\x|$")


def _verb(payload: str) -> str:
    """The protocol verb a payload starts with (strace's escaped form), or ""."""
    m = _VERB_END.search(payload)
    word = payload[:m.start()] if m else payload
    if not _VERB.fullmatch(word):
        return ""
    letters = word.lstrip("+-")
    return word if clear_word(letters) else ""


def strace_line(line: str, verbs: bool = False, hits: Optional[Dict[str, int]] = None) -> str:
    """One strace line with its payloads reduced (see the module's docstring); hits counts them."""
    if '"' not in line:
        return line
    m = _CALL.match(line)
    call = (m.group("resumed") or m.group("call")) if m else ""
    keep_first = call in _PATH_CALLS and m is not None and m.group("call") is not None
    out = []
    done = 0
    for n, s in enumerate(_STRACE_STRING.finditer(line)):
        text = s.group(0)
        before = line[max(0, s.start() - 9):s.start()]
        path = (keep_first and n == 0) or before.endswith("sun_path=")
        if not path:
            inner = text[1:text.rindex('"')]
            verb = _verb(inner) if verbs else ""
            if inner != verb and hits is not None:
                hits["strace-payload"] = hits.get("strace-payload", 0) + 1
            text = '"%s"...' % verb
        out.append(line[done:s.start()] + text)
        done = s.end()
    out.append(line[done:])
    return "".join(out)


def strace_text(text: str, verbs: bool = False, hits: Optional[Dict[str, int]] = None) -> str:
    """Every line of strace's output with its payloads reduced."""
    if '"' not in text:
        return text
    return "\n".join(strace_line(line, verbs, hits) for line in text.split("\n"))


# gdb's C string: "..." with escapes, optionally followed by `...` (cut by print elements) or a `<repeats N times>`
_GDB_STRING = lazy(r'"(?:[^"\\\n]|\\.)*"(?:\.\.\.)?')
_ESCAPE = lazy(r"\\(?:[0-7]{1,3}|x[0-9a-fA-F]+|.)")
_THREAD_HEADER = lazy(r"^\s*(?:\*\s*)?(?:Thread|\[Switching to thread|\[New Thread)\b")


def gdb_text(text: str, hits: Optional[Dict[str, int]] = None) -> str:
    """gdb's output with every C string replaced by its size; thread headers (which name threads) kept."""
    if '"' not in text:
        return text
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if '"' not in line or _THREAD_HEADER.match(line):
            continue
        lines[i], n = _GDB_STRING.subn(_size, line)
        if n and hits is not None:
            hits["gdb-string"] = hits.get("gdb-string", 0) + n
    return "\n".join(lines)


# gdb's thread headers, its `info threads` rows included (`* 2 Thread 0x.. (LWP 12) "name" 0x.. in f`): their
# quoted strings are OS thread names, the only strings gdb_text leaves.
_NAMED_HEADER = lazy(r"^\s*(?:\*\s*)?(?:\d+\s+)?(?:Thread|\[Switching to thread|\[New Thread)\b")
_NAME_STRING = lazy(r'"((?:[^"\\\n]|\\.)*)"')


def gdb_thread_names(text: str, name: "Callable[[str], str]") -> str:
    """gdb's output with each thread name in its thread headers replaced by name(it): a thread's name is judged
    as one (the rule for names the job chose), never as words of a line."""
    if '"' not in text:
        return text
    rows = text.split("\n")
    for i, row in enumerate(rows):
        if '"' in row and _NAMED_HEADER.match(row):
            rows[i] = _NAME_STRING.sub(lambda m: '"%s"' % name(m.group(1)), row)
    return "\n".join(rows)


def _size(m: "re.Match[str]") -> str:
    s = m.group(0)
    inner = s[1:s.rindex('"')]
    n = len(_ESCAPE.sub("x", inner))
    return "<%d bytes%s>" % (n, " or more" if s.endswith("...") else "")
