"""A seccomp filter for the remote-code sandbox: no new user namespaces.

A worker that runs as root starts bwrap without a user namespace (see `bwrap`), so bwrap's own
`--disable-userns` cannot apply there, and nobody may create user namespaces on most kernels:
each one is more kernel surface within reach of the release's code. This classic-BPF program
(handed to `bwrap --seccomp FD`) refuses `unshare` and `clone` with CLONE_NEWUSER (EPERM),
`clone3` (ENOSYS: its flags are behind a pointer a filter cannot read; glibc then falls back to
`clone`, as under Flatpak's filter), and every syscall of another ABI (x32, i386: ENOSYS), so
none of those can slip past it. Everything else is allowed.

Built for x86_64 and aarch64 only (`program` returns None elsewhere: no filter).
"""

from __future__ import annotations

import contextlib
import errno
import os
import platform
import struct
from collections.abc import Iterator

# <linux/filter.h>, <linux/seccomp.h>, <linux/audit.h>, <linux/sched.h>
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000
_X32_SYSCALL_BIT = 0x40000000
# seccomp_data: nr at 0, arch at 4, args[0] (its low 32 bits on these little-endian ABIs) at 16
_NR, _ARCH, _ARG0 = 0, 4, 16
# (audit arch, clone, unshare, clone3, has the x32 ABI)
_ARCHES = {
    "x86_64": (0xC000003E, 56, 272, 435, True),
    "aarch64": (0xC00000B7, 220, 97, 435, False),
}


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
    """The filter as bytes of `struct sock_filter` for `machine` (default: this one's
    `platform.machine()`); None for an architecture it is not written for."""
    arch = _ARCHES.get(machine or platform.machine())
    if arch is None:
        return None
    audit_arch, clone, unshare, clone3, x32 = arch
    enosys, eperm = _ERRNO | errno.ENOSYS, _ERRNO | errno.EPERM
    out = [
        _ins(_LD_W_ABS, _ARCH),
        _ins(_JEQ_K, audit_arch, 1, 0),
        _ins(_RET_K, enosys),  # another ABI
        _ins(_LD_W_ABS, _NR),
    ]
    if x32:
        out += [_ins(_JGE_K, _X32_SYSCALL_BIT, 0, 1), _ins(_RET_K, enosys)]
    out += [
        _ins(_JEQ_K, clone3, 0, 1),
        _ins(_RET_K, enosys),
        _ins(_JEQ_K, unshare, 1, 0),
        _ins(_JEQ_K, clone, 0, 3),
        _ins(_LD_W_ABS, _ARG0),
        _ins(_JSET_K, CLONE_NEWUSER, 0, 1),
        _ins(_RET_K, eperm),
        _ins(_RET_K, _ALLOW),
    ]
    return b"".join(out)


@contextlib.contextmanager
def filter_fd(machine: str | None = None) -> Iterator[int | None]:
    """A pipe's read end holding `program()` (bwrap reads it to its end) for one bwrap run,
    closed after; None where there is no filter for this architecture."""
    code = program(machine)
    if code is None:
        yield None
        return
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, code)  # a few hundred bytes: within any pipe's buffer
        os.close(write_end)
        yield read_end
    finally:
        os.close(read_end)
