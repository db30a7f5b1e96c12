"""strace payloads and gdb strings are not text (workers/tooltext.py): sizes, syscalls and results stay; the bytes
go, and --strace-data keeps only a payload's protocol verb."""

from __future__ import annotations

import pytest

from workers.tooltext import gdb_text, strace_line, strace_text


def q(payload: str) -> str:
    """A payload as strace prints it: C escapes, quoted, cut at 64 bytes with `...`."""
    cut = payload[:64]  # strace cuts the bytes, then escapes them
    esc = cut.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n").replace("\0", "\\0")
    return '"%s"%s' % (esc, "..." if len(payload) > 64 else "")


# protocol lines that carry a login, as a client sends them (none of these values may survive)
LOGINS = [
    ("AUTH default k3Yv9xQ2\r\n", "AUTH"),  # Redis, inline
    ("*3\r\n$4\r\nAUTH\r\n$7\r\ndefault\r\n$8\r\nk3Yv9xQ2\r\n", ""),  # Redis, RESP array
    ("a001 LOGIN alice k3Yv9xQ2\r\n", ""),  # IMAP: a tag first
    ("CONNECT\naccept-version:1.2\nlogin:guest\npasscode:k3Yv9xQ2\n\n\0", "CONNECT"),  # STOMP
    ("addauth digest alice:k3Yv9xQ2", ""),  # ZooKeeper's CLI
    ("\0alice\0k3Yv9xQ2", ""),  # SASL PLAIN
    ("azNZdjl4UTI=\r\n", ""),  # SMTP AUTH LOGIN: the password line alone, base64
    ("c=biws,r=fyko+d2lbbFgONRv9qkxdawL,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=", ""),  # SCRAM client-final
    ('{"user": "alice", "password": "k3Yv9xQ2", "scope": "read write admin"}', ""),  # JSON cut at 64 bytes
    ("PASS k3Yv9xQ2\r\n", "PASS"),  # FTP, POP3
    ("GET /v1/secret?token=k3Yv9xQ2 HTTP/1.1\r\nHost: vault\r\n", "GET"),
]


@pytest.mark.parametrize("payload, verb", LOGINS)
def test_a_payload_is_its_verb_at_most(payload: str, verb: str) -> None:
    line = '12:00:00.000001 sendto(5, %s, %d, 0, NULL, 0) = %d <0.000010>' % (q(payload), len(payload), len(payload))
    out = strace_line(line, verbs=True)
    assert out == '12:00:00.000001 sendto(5, "%s"..., %d, 0, NULL, 0) = %d <0.000010>' % (
        verb, len(payload), len(payload))
    assert "k3Yv9xQ2" not in out and "alice" not in out
    assert strace_line(line) == '12:00:00.000001 sendto(5, ""..., %d, 0, NULL, 0) = %d <0.000010>' % (
        len(payload), len(payload))


def test_replies_read_back_and_resumed_calls_too() -> None:
    text = ('[pid 12] read(5,  <unfinished ...>\n'
            '[pid 12] <... read resumed>"$8\\r\\nk3Yv9xQ2\\r\\n", 4096) = 14\n'
            'recvfrom(5, "+OK\\r\\n", 4096, 0, NULL, NULL) = 5')
    out = strace_text(text, verbs=True)
    assert "k3Yv9xQ2" not in out
    assert '<... read resumed>""..., 4096) = 14' in out and 'recvfrom(5, "+OK"..., 4096' in out


def test_paths_stay_where_the_call_takes_one() -> None:
    text = ('openat(AT_FDCWD, "/etc/ssl/private/node.pem", O_RDONLY|O_CLOEXEC) = 3\n'
            'connect(4, {sa_family=AF_UNIX, sun_path="/run/redis.sock"}, 110) = 0\n'
            'execve("/usr/bin/mysql", ["mysql", "-pk3Yv9xQ2"], 0x7ffd /* 3 vars */) = 0')
    out = strace_text(text, verbs=True)
    assert '"/etc/ssl/private/node.pem"' in out and 'sun_path="/run/redis.sock"' in out
    assert 'execve("/usr/bin/mysql", [""..., ""...]' in out and "k3Yv9xQ2" not in out


def test_gdb_strings_become_their_size_and_thread_names_stay() -> None:
    text = ('Thread 2 (Thread 0x7f3a (LWP 4242) "redis-client"):\n'
            '#0  0x00007f in __libc_recv (fd=5, buf=0x7ffd1234 "+OK k3Yv9xQ2\\r\\n", len=4096, flags=0) '
            'at ../sysdeps/unix/sysv/linux/recv.c:28\n'
            '#1  0x000055 in send_command (cmd=0x55 "AUTH alice k3Yv9xQ2"...) at client.c:10\n'
            '#2  0x000056 in main (argc=1, argv=0x7ffe) at client.c:40')
    out = gdb_text(text)
    assert "k3Yv9xQ2" not in out and "alice" not in out
    assert 'Thread 2 (Thread 0x7f3a (LWP 4242) "redis-client"):' in out
    assert "buf=0x7ffd1234 <14 bytes>, len=4096" in out and "cmd=0x55 <19 bytes or more>)" in out
    assert "#2  0x000056 in main (argc=1, argv=0x7ffe) at client.c:40" in out


def test_text_without_strings_is_untouched() -> None:
    text = "futex(0x55d0, FUTEX_WAIT_BITSET_PRIVATE|FUTEX_CLOCK_REALTIME, 0, NULL, FUTEX_BITSET_MATCH_ANY"
    assert strace_text(text) == text and gdb_text("#0  syscall () at syscall.S:38") == "#0  syscall () at syscall.S:38"
