"""A FUSE file system, in plain Python on /dev/fuse, whose one file never answers a read: a process reading it
sits in uninterruptible sleep (D) in the kernel, as on a hung network file system. Used by the tests to produce a
real D-state rank (no libfuse needed). Root only.

    python fuse_stall.py MOUNTPOINT     # mounts, prints "ready", serves until killed

The file is MOUNTPOINT/stalled (1 MiB). With FUSE_ASYNC_READ, a read goes out as readahead and the reader waits
on the locked page, killable but uninterruptible: state D, wchan folio_wait_bit_common or similar.
"""

import errno
import os
import stat
import struct
import subprocess
import sys

IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, total_extlen, padding
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # ino size blocks atime mtime ctime *nsec mode nlink uid gid rdev blksize flags
LOOKUP, FORGET, GETATTR, OPEN, READ, RELEASE, FLUSH, INIT, OPENDIR, READDIR, RELEASEDIR = 1, 2, 3, 14, 15, 18, 25, \
    26, 27, 28, 29
INTERRUPT, DESTROY, BATCH_FORGET = 36, 38, 42
FUSE_ASYNC_READ = 1
SIZE = 1 << 20


def attr(ino: int) -> bytes:
    if ino == 1:
        return ATTR.pack(1, 0, 0, 0, 0, 0, 0, 0, 0, stat.S_IFDIR | 0o755, 2, 0, 0, 0, 4096, 0)
    return ATTR.pack(2, SIZE, SIZE // 512, 0, 0, 0, 0, 0, 0, stat.S_IFREG | 0o444, 1, 0, 0, 0, 4096, 0)


def main(mountpoint: str) -> None:
    fd = os.open("/dev/fuse", os.O_RDWR)
    subprocess.run(["mount", "-t", "fuse", "-o", f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other",
                    "stall", mountpoint], check=True, pass_fds=(fd,))

    def reply(unique: int, body: bytes = b"", error: int = 0) -> None:
        os.write(fd, OUT_HEADER.pack(OUT_HEADER.size + len(body), -error, unique) + body)

    print("ready", flush=True)
    while True:
        try:
            data = os.read(fd, (1 << 20) + 4096)
        except OSError as exc:
            if exc.errno == errno.ENODEV:  # unmounted or aborted
                return
            if exc.errno == errno.EINTR:
                continue
            raise
        _, opcode, unique, nodeid = IN_HEADER.unpack_from(data)[:4]
        body = data[IN_HEADER.size:]
        if opcode == INIT:
            major, minor = struct.unpack_from("<II", body)
            reply(unique, struct.pack("<IIIIHHIIHHII6I", 7, min(minor, 31), 1 << 17, FUSE_ASYNC_READ, 16, 12,
                                      1 << 17, 1, 32, 0, 0, 0, *([0] * 6)))
        elif opcode == LOOKUP:
            name = body.split(b"\0", 1)[0]
            if nodeid == 1 and name == b"stalled":
                reply(unique, struct.pack("<QQQQII", 2, 0, 3600, 3600, 0, 0) + attr(2))
            else:
                reply(unique, error=errno.ENOENT)
        elif opcode == GETATTR:
            reply(unique, struct.pack("<QII", 3600, 0, 0) + attr(nodeid))
        elif opcode in (OPEN, OPENDIR):
            reply(unique, struct.pack("<QII", 0, 0, 0))
        elif opcode == READ:
            continue  # the storage that never answers
        elif opcode in (RELEASE, RELEASEDIR, FLUSH):
            reply(unique)
        elif opcode in (FORGET, BATCH_FORGET):
            continue  # no reply expected
        elif opcode == INTERRUPT:
            continue  # ignored: the read stays pending
        elif opcode == DESTROY:
            reply(unique)
            return
        else:
            reply(unique, error=errno.ENOSYS)


if __name__ == "__main__":
    main(sys.argv[1])
