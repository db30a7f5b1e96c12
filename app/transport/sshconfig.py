"""The ssh config for one host, with every config file tokenized once per process, not once per host.

asyncssh's parser (asyncssh 2.24, `SSHConfig.parse`) reads a config file for each host it looks up and splits
every line with `shlex` (~15 us a line in Python) before it knows whether the line's block applies to that
host. A cluster's config often has a block per node (`Host node0042` / `HostName 10.0.0.42`), so the file
grows with the cluster and every host's lookup reads all of it: measured here, 3 ms a host at 16 blocks, 28 ms at
200 and 231 ms at 2,000, that is ~8 minutes of login CPU for a 2,000-node session's lookups.

`HostConfig` is asyncssh's `SSHClientConfig` with its `parse` over lines tokenized once per file (kept while
the file's inode, size and modification time stay the same): the same splitting, the same `=` forms and
`_no_split` options, the same errors (a line shlex cannot split fails the lookup when it is reached, as
asyncssh's does), and asyncssh's own handlers, `Match` evaluation, `Include` and `%` expansion. The lines are
kept as blocks (a Host or Match line and the lines up to the next), and a block whose condition does not
hold is passed over at once, as asyncssh passes over each of its lines. A `Host` line's pattern list is built
once, and a `Host` line of plain names (no `*`, `?` or `!`) is decided by equality, which is what asyncssh's
fnmatch of such a name amounts to. tests/transport/test_ssh_config.py compares both parsers' options for hosts
of a config that uses every construct. Measured (a block of 5 lines per node, CPU on this machine):

| blocks in the file | asyncssh, per host | HostConfig, per host | HostConfig, once per file |
|---|---|---|---|
| 200 | 27 ms | 0.09 ms | 15 ms |
| 2,000 | 203-262 ms | 0.25 ms | 147 ms |
| 12,500 | ~1.3 s (projected) | 4.1 ms | 945 ms |
"""

from __future__ import annotations

import os
import shlex
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from app.transport.sshlib import asyncssh

# One line: (line number, lower-cased option, its arguments, or the shlex error text instead of an option).
_Line = Tuple[int, str, Tuple[str, ...], Optional[str]]
_MAX_FILES = 64  # distinct config files kept (Include can name many; each is small)
_MAX_BYTES = 8 << 20  # a config file larger than this is left to asyncssh's own parser

# A block: its conditional line (None for the lines before the first), its other lines, whether one of them failed,
# and for a `Host` line of plain names (no wildcard, no negation) those names: asyncssh's fnmatch of a plain
# name is equality, so such a block applies exactly when the host is one of them.
_Block = Tuple[Optional[_Line], List[_Line], bool, Optional[frozenset[str]]]

_cache: Dict[str, Tuple[Tuple[int, int, int], List[_Block]]] = {}
_MAX_PATTERNS = 100_000  # Host pattern lists kept (one per distinct Host line; cleared when full)
_host_patterns: Dict[str, Any] = {}
_lock = threading.Lock()


def _tokenize(text: str, conditionals: frozenset[str] | set[str], no_split: frozenset[str] | set[str]
              ) -> List[_Line]:
    """asyncssh's splitting of each line (SSHConfig.parse), done once: what does not depend on the host."""
    out: List[_Line] = []
    for line_no, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] == "#":
            continue
        try:
            split_args = shlex.split(line)
        except ValueError as exc:
            out.append((line_no, "", (), str(exc)))
            continue
        args: List[str] = []
        loption = ""
        allow_equal = True
        for i, arg in enumerate(split_args, 1):
            if arg.startswith("="):
                if len(arg) > 1:
                    args.append(arg[1:])
            elif not allow_equal:
                args.extend(split_args[i - 1:])
                break
            elif arg.endswith("="):
                args.append(arg[:-1])
            elif "=" in arg:
                arg, val = arg.split("=", 1)
                args.append(arg)
                args.append(val)
            else:
                args.append(arg)
            if i == 1:
                loption = args.pop(0).lower()
                allow_equal = loption in conditionals
        if loption in no_split:
            args = [line.lstrip()[len(loption):].strip()]
        out.append((line_no, loption, tuple(args), None))
    return out


def _file_blocks(path: Path, conditionals: frozenset[str] | set[str], no_split: frozenset[str] | set[str]
                 ) -> Optional[List[_Block]]:
    """The file's tokenized blocks, from the cache while the file is unchanged; None: asyncssh reads it."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # asyncssh's own open() raises what it raises for a missing or unreadable file
    if st.st_size > _MAX_BYTES:
        return None
    key, stamp = str(path), (st.st_ino, st.st_size, st.st_mtime_ns)
    with _lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        with open(path, encoding="utf-8") as f:  # asyncssh reads the file as text in the same way
            text = f.read(_MAX_BYTES + 1)
    except (OSError, UnicodeDecodeError):
        return None
    blocks = _blocks(_tokenize(text, conditionals, no_split), conditionals)
    with _lock:
        if len(_cache) >= _MAX_FILES:
            _cache.pop(next(iter(_cache)))
        _cache[key] = (stamp, blocks)
    return blocks


def _blocks(lines: List[_Line], conditionals: frozenset[str] | set[str]) -> List[_Block]:
    """The lines as blocks: a conditional line (Host, Match; None before the first) and the lines up to the next
    one, with whether any of them failed to split (asyncssh reports that even inside a block that does not
    apply)."""
    blocks: List[_Block] = []
    head: Optional[_Line] = None
    body: List[_Line] = []

    def close() -> None:
        names = None
        if head is not None and head[1] == "host" and head[2]:
            patterns = ",".join(head[2]).split(",")  # as asyncssh's Host handler and pattern list split them
            if not any(c in p for p in patterns for c in "*?!"):
                names = frozenset(patterns)
        blocks.append((head, body, any(b[3] is not None for b in body), names))

    for line in lines:
        if line[1] in conditionals and line[3] is None:
            if head is not None or body:
                close()
            head, body = line, []
        else:
            body.append(line)
    if head is not None or body:
        close()
    return blocks


class HostConfig(asyncssh.config.SSHClientConfig):
    """asyncssh's client config, its files tokenized once per process (see the module's docstring)."""

    def parse(self, path: Path) -> None:
        blocks = _file_blocks(path, self._conditionals, self._no_split)
        if blocks is None:
            super().parse(path)
            return
        # What asyncssh's SSHConfig.parse does per line, after its splitting (asyncssh 2.24.1, pinned); a block
        # whose condition does not hold is passed over at once, as asyncssh passes over each of its lines.
        self._path = path
        self._line_no = 0
        self._matching = True
        self._tokens = {"%": "%"}
        for head, body, has_error, names in blocks:
            if names is not None:
                assert head is not None
                self._line_no = head[0]
                self._matching = self._orig_host in names
            elif head is not None:
                self._line(head)
            if not self._matching and not has_error:
                continue
            for line in body:
                self._line(line)
        self._set_tokens()
        for option in self._percent_expand:
            try:
                value: object = self._options[option]
            except KeyError:
                pass
            else:
                if isinstance(value, list):
                    value = [self._expand_val(item) for item in value]
                elif isinstance(value, str):
                    value = self._expand_val(value)
                self._options[option] = value

    def _match_host(self, option: str, args: List[str]) -> None:
        """asyncssh's `Host` handler, with each line's pattern list built once per process, not once per host."""
        pattern = ",".join(args)
        matcher = _host_patterns.get(pattern)
        if matcher is None:
            matcher = asyncssh.pattern.WildcardPatternList(pattern)
            if len(_host_patterns) >= _MAX_PATTERNS:
                _host_patterns.clear()
            _host_patterns[pattern] = matcher
        self._matching = matcher.matches(self._orig_host)
        args.clear()

    # asyncssh dispatches on functions, not names: the table with this class's `Host` handler
    _handlers = {**asyncssh.config.SSHClientConfig._handlers, "host": ("Host", _match_host)}

    def _line(self, line: _Line) -> None:
        line_no, loption, split, error = line
        self._line_no = line_no
        if error is not None:
            self._error(error)
        if not self._matching and loption not in self._conditionals:
            return
        try:
            option, handler = self._handlers[loption]
        except KeyError:
            return
        if not split:
            self._error(f"Missing {option} value")
        args = list(split)  # the handlers consume their arguments
        handler(self, option, args)
        if args:
            self._error(f'Extra data at end: {" ".join(args)}')
