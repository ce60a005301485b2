"""A seccomp filter that keeps user namespaces out of the jail.

Inside a user namespace of its own an unprivileged process holds every capability over the
namespaces it makes there (`unshare -Urn`): not an escape by itself, but the kernel surface
that most privilege escalations of recent years went through (netfilter, mounts). Agents
never need one, so the jail refuses them with this filter, which bubblewrap installs just
before it runs the agent (`--seccomp FD`), and which every process the agent starts inherits:

* `unshare` and `clone` with `CLONE_NEWUSER` fail with EPERM (what a kernel without user
  namespaces answers);
* `clone3` fails with ENOSYS: its flags are in memory, out of a filter's reach, and C
  libraries fall back to `clone` on ENOSYS (Docker's default profile does the same);
* on x86_64, the 32-bit and x32 entry points are held to the same rules (or refused).

Everything else is allowed. bubblewrap's own `--disable-userns` would need the jail to live in
a user namespace, which, with bubblewrap run as root, maps the sandbox's uid onto root's.
"""

from __future__ import annotations

import os
import platform
import struct
from dataclasses import dataclass

CLONE_NEWUSER = 0x10000000
EPERM = 1
ENOSYS = 38

# linux/audit.h
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

# linux/seccomp.h
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000

# linux/filter.h: class | size | mode | op | src
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K

# struct seccomp_data: nr, arch, instruction_pointer, args[6] (64 bits each, little-endian:
# the low half of args[0], where the clone flags are, at offset 16).
NR, ARCH, ARG0_LOW = 0, 4, 16


@dataclass(frozen=True)
class Calls:
    """The numbers of the guarded system calls in one ABI."""

    arch: int
    unshare: int
    clone: int
    clone3: int


X86_64 = Calls(AUDIT_ARCH_X86_64, unshare=272, clone=56, clone3=435)
I386 = Calls(AUDIT_ARCH_I386, unshare=310, clone=120, clone3=435)
AARCH64 = Calls(AUDIT_ARCH_AARCH64, unshare=97, clone=220, clone3=435)
ABIS = {"x86_64": (X86_64, I386), "aarch64": (AARCH64,)}


def supported() -> bool:
    """Return whether this machine's architecture has a filter here."""
    return platform.machine() in ABIS


def program(machine: str | None = None) -> bytes:
    """Return the filter for this machine's architecture (or `machine`'s), as the array of
    `struct sock_filter` that bubblewrap's `--seccomp` reads."""
    abis = ABIS[machine or platform.machine()]
    code: list[tuple[int, int, int, int]] = [(LD_W_ABS, 0, 0, ARCH)]
    blocks = [_abi_block(abi) for abi in abis]
    # The dispatch on the ABI: jump over the blocks before ours. Any other ABI the kernel
    # offers (32-bit ARM on aarch64) falls through to ENOSYS for every call.
    offset = 0
    for index, abi in enumerate(abis):
        rest = len(abis) - index - 1  # dispatch instructions after this one
        code.append((JEQ_K, rest + 1 + offset, 0, abi.arch))
        offset += len(blocks[index])
    code.append((RET_K, 0, 0, RET_ERRNO | ENOSYS))
    for block in blocks:
        code += block
    return b"".join(struct.pack("<HBBI", *instruction) for instruction in code)


def _abi_block(abi: Calls) -> list[tuple[int, int, int, int]]:
    """Return the instructions that judge one call of `abi` (its number not yet loaded)."""
    block = [(LD_W_ABS, 0, 0, NR)]
    if abi.arch == AUDIT_ARCH_X86_64:
        # x32 calls (the x86_64 numbers with bit 30 set): nothing here uses them.
        block += [(JGE_K, 0, 1, X32_SYSCALL_BIT), (RET_K, 0, 0, RET_ERRNO | ENOSYS)]
    block += [
        (JEQ_K, 0, 1, abi.clone3),
        (RET_K, 0, 0, RET_ERRNO | ENOSYS),
        (JEQ_K, 1, 0, abi.unshare),
        (JEQ_K, 0, 3, abi.clone),
        (LD_W_ABS, 0, 0, ARG0_LOW),
        (JSET_K, 0, 1, CLONE_NEWUSER),
        (RET_K, 0, 0, RET_ERRNO | EPERM),
        (RET_K, 0, 0, RET_ALLOW),
    ]
    return block


def program_fd() -> int:
    """Return a new file descriptor holding the filter, at its start, inheritable: for one
    bubblewrap to read (`--seccomp FD`); close it once that one is started."""
    fd = os.memfd_create("craft-seccomp", 0)
    try:
        os.write(fd, program())
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
