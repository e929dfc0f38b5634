"""Landlock rules for the jail, where the kernel has Landlock (Linux 5.13+), through ctypes.

Stdlib only, like ``_launcher.py``, which imports it. The mounts already decide what the program
can see; Landlock is the second lock on the same doors, enforced by the kernel on every path
lookup, so that a way around the mount layout (a directory descriptor leaked into the jail, say)
still reaches nothing. Rules (each applies beneath its path):

- ``/``: list directories; the read-only binds: read, list and execute; the device nodes: read
  and write; the scratch folder (``writable``): everything;
- TCP (Landlock ABI 4+): no bind, no connect, on any port (the network namespace has no
  interface up anyway);
- scopes (ABI 6+): no abstract Unix socket and no signal reaches past the program's own
  processes.

A kernel without Landlock (or with it disabled) gets no rules: ``restrict`` returns the ABI version
it enforced, 0 for none.
"""

import ctypes
import os
import struct

SYS_CREATE_RULESET, SYS_ADD_RULE, SYS_RESTRICT_SELF = 444, 445, 446  # the same on every architecture
CREATE_RULESET_VERSION, RULE_PATH_BENEATH = 1, 1
EOPNOTSUPP, ENOSYS = 95, 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1, 2, 4, 8
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
BIND_TCP, CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1, 2

_libc = ctypes.CDLL(None, use_errno=True)


def _fs_rights(abi):
    rights = (1 << 13) - 1  # ABI 1: execute ... make_sym
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def _call(result, what):
    if result < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"landlock {what}: {os.strerror(errno)}")
    return result


def restrict(read_only, devices, writable):
    """Restrict the calling thread and its future children; the ABI version enforced (0: none)."""
    abi = _libc.syscall(SYS_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    if abi < 0:
        if ctypes.get_errno() in (EOPNOTSUPP, ENOSYS):
            return 0
        _call(abi, "version")
    handled = _fs_rights(abi)
    attr = struct.pack("=QQQ", handled, BIND_TCP | CONNECT_TCP, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = _call(_libc.syscall(SYS_CREATE_RULESET, attr[:size], ctypes.c_size_t(size), 0), "create_ruleset")
    try:
        rules = [("/", READ_DIR)]
        rules += [(path, READ_FILE | READ_DIR | EXECUTE) for path in read_only]
        rules += [(path, READ_FILE | WRITE_FILE) for path in devices]
        rules += [(path, handled) for path in writable]
        for path, rights in rules:
            if not os.path.exists(path):
                continue
            descriptor = os.open(path, os.O_PATH | os.O_CLOEXEC)
            try:
                rule = struct.pack("=Qi", rights, descriptor)  # struct landlock_path_beneath_attr, packed
                _call(_libc.syscall(SYS_ADD_RULE, ruleset, RULE_PATH_BENEATH, rule, 0), f"add_rule {path}")
            finally:
                os.close(descriptor)
        _call(_libc.syscall(SYS_RESTRICT_SELF, ruleset, 0), "restrict_self")
    finally:
        os.close(ruleset)
    return abi
