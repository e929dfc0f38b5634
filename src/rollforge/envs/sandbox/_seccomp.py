"""The jail's seccomp filter: a small classic-BPF program, installed with ``prctl`` through ctypes.

Stdlib only, like ``_launcher.py``, which imports it. The filter is a deny list in the spirit of
Docker's default profile, for the calls an unprivileged program in the jail could still make and
that either reach past the jail or open the kernel's less travelled paths:

- keyrings (``add_key``, ``request_key``, ``keyctl``): shared by every process of a uid;
- namespaces and mounts (``unshare``, ``setns``, ``clone`` with a ``CLONE_NEW*`` flag, the
  mount family): a nested user namespace grants capabilities over new namespaces;
- memory outside RLIMIT_AS (``memfd_create``, ``memfd_secret``);
- other processes' memory and kernel attack surface (``ptrace``, ``process_vm_*``, ``kcmp``,
  ``pidfd_getfd``, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring_*``,
  ``open_by_handle_at``, module and kexec loading).

Refused calls fail with EPERM; ``clone3`` fails with ENOSYS (its flags live in memory a filter
cannot read), and the C library falls back to ``clone``. A call from another ABI (i386 or x32
on x86_64) kills the process: the deny list names only the native numbers. On architectures
other than x86_64 and aarch64 no filter is installed (``FILTERED`` says whether one is).
"""

import ctypes
import os
import platform
import struct

PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
EPERM, ENOSYS = 1, 38
LD_ABS_W, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
NR_OFFSET, ARCH_OFFSET, ARG0_OFFSET = 0, 4, 16  # struct seccomp_data, little-endian
X32_BIT = 0x40000000
CLONE_NEW_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET

DENIED = (
    "add_key request_key keyctl unshare setns mount umount2 pivot_root open_tree move_mount fsopen "
    "fsconfig fsmount fspick mount_setattr memfd_create memfd_secret ptrace process_vm_readv "
    "process_vm_writev kcmp pidfd_getfd bpf perf_event_open userfaultfd io_uring_setup io_uring_enter "
    "io_uring_register open_by_handle_at name_to_handle_at init_module finit_module delete_module "
    "kexec_load kexec_file_load"
).split()

#: (audit arch, syscall numbers by name), from the kernel's unistd headers.
ARCHES = {
    "x86_64": (
        0xC000003E,
        dict(
            add_key=248,
            request_key=249,
            keyctl=250,
            unshare=272,
            setns=308,
            mount=165,
            umount2=166,
            pivot_root=155,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            memfd_create=319,
            memfd_secret=447,
            ptrace=101,
            process_vm_readv=310,
            process_vm_writev=311,
            kcmp=312,
            pidfd_getfd=438,
            bpf=321,
            perf_event_open=298,
            userfaultfd=323,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            open_by_handle_at=304,
            name_to_handle_at=303,
            init_module=175,
            finit_module=313,
            delete_module=176,
            kexec_load=246,
            kexec_file_load=320,
            clone=56,
            clone3=435,
            shmget=29,
            msgget=68,
        ),
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            add_key=217,
            request_key=218,
            keyctl=219,
            unshare=97,
            setns=268,
            mount=40,
            umount2=39,
            pivot_root=41,
            open_tree=428,
            move_mount=429,
            fsopen=430,
            fsconfig=431,
            fsmount=432,
            fspick=433,
            mount_setattr=442,
            memfd_create=279,
            memfd_secret=447,
            ptrace=117,
            process_vm_readv=270,
            process_vm_writev=271,
            kcmp=272,
            pidfd_getfd=438,
            bpf=280,
            perf_event_open=241,
            userfaultfd=282,
            io_uring_setup=425,
            io_uring_enter=426,
            io_uring_register=427,
            open_by_handle_at=265,
            name_to_handle_at=264,
            init_module=105,
            finit_module=273,
            delete_module=106,
            kexec_load=104,
            kexec_file_load=294,
            clone=220,
            clone3=435,
            shmget=194,
            msgget=186,
        ),
    ),
}

FILTERED = platform.machine() in ARCHES


def _op(code, k, jt=0, jf=0):
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine, also_denied=()):
    """The filter for ``machine`` as packed ``struct sock_filter`` entries; ``also_denied`` names
    more calls to refuse (``shmget`` and ``msgget`` where the IPC namespace's limits could not be set)."""
    arch, numbers = ARCHES[machine]
    ops = [_op(LD_ABS_W, ARCH_OFFSET), _op(JEQ, arch, jt=1), _op(RET, RET_KILL_PROCESS), _op(LD_ABS_W, NR_OFFSET)]
    if machine == "x86_64":
        ops += [_op(JGE, X32_BIT, jf=1), _op(RET, RET_KILL_PROCESS)]
    for name in (*DENIED, *also_denied):
        ops += [_op(JEQ, numbers[name], jf=1), _op(RET, RET_ERRNO | EPERM)]
    ops += [_op(JEQ, numbers["clone3"], jf=1), _op(RET, RET_ERRNO | ENOSYS)]
    ops += [
        _op(JEQ, numbers["clone"], jf=3),
        _op(LD_ABS_W, ARG0_OFFSET),  # the low half of the flags
        _op(JSET, CLONE_NEW_FLAGS, jf=1),
        _op(RET, RET_ERRNO | EPERM),
        _op(RET, RET_ALLOW),
    ]
    return ops


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install_filter(also_denied=()):
    """Install the filter on the calling thread (``no_new_privs`` must be set); no-op off x86_64/aarch64."""
    if not FILTERED:
        return
    ops = program(platform.machine(), also_denied)
    code = b"".join(ops)
    fprog = _Program(len(ops), code)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(seccomp filter): {os.strerror(errno)}")
