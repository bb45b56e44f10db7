#!/usr/bin/python3
"""Runs a program on a kernel that pretends to have no openat2.

    filesfix_noopenat2.py PROGRAM [ARGS...]

Installs a seccomp filter that makes openat2(2) fail with ENOSYS (as on a
kernel older than 5.6), then execs PROGRAM: the filter survives execve, so the
broker sees exactly what it would see on such a kernel and must fail closed.
Every other system call is allowed. Standard library only (ctypes).
"""

import ctypes
import os
import platform
import struct
import sys

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_ERRNO = 0x00050000
ENOSYS = 38
NR_OPENAT2 = 437  # the same number in the x86_64 and the generic (aarch64) tables

BPF_LD_W_ABS = 0x00 | 0x00 | 0x20
BPF_JMP_JEQ_K = 0x05 | 0x10 | 0x00
BPF_RET_K = 0x06 | 0x00

ARCHES = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def insn(code, k, jt=0, jf=0):
    return struct.pack("HBBI", code, jt, jf, k)


def install():
    arch = ARCHES.get(platform.machine())
    if arch is None:
        sys.stderr.write("filesfix_noopenat2: unsupported architecture %s\n" % platform.machine())
        sys.exit(125)
    prog = b"".join([
        insn(BPF_LD_W_ABS, 4),                    # seccomp_data.arch
        insn(BPF_JMP_JEQ_K, arch, 1, 0),
        insn(BPF_RET_K, SECCOMP_RET_ALLOW),       # another ABI: not ours to judge
        insn(BPF_LD_W_ABS, 0),                    # seccomp_data.nr
        insn(BPF_JMP_JEQ_K, NR_OPENAT2, 0, 1),
        insn(BPF_RET_K, SECCOMP_RET_ERRNO | ENOSYS),
        insn(BPF_RET_K, SECCOMP_RET_ALLOW),
    ])
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.stderr.write("filesfix_noopenat2: PR_SET_NO_NEW_PRIVS: %s\n" % os.strerror(ctypes.get_errno()))
        sys.exit(125)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        sys.stderr.write("filesfix_noopenat2: PR_SET_SECCOMP: %s\n" % os.strerror(ctypes.get_errno()))
        sys.exit(125)


def main():
    if len(sys.argv) < 2:
        sys.stderr.write(__doc__)
        sys.exit(2)
    install()
    os.execv(sys.argv[1], sys.argv[1:])


if __name__ == "__main__":
    main()
