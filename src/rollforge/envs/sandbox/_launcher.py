"""The sandbox launcher: runs as ``python -I -S _launcher.py``, builds the jail, runs the program.

Standalone on purpose (stdlib only, no rollforge import): it runs before and after ``pivot_root``,
where the rollforge source tree is not visible. The host (``sandbox/runner.py``) writes one JSON
job to its stdin, passes two pipe ends by number in argv (moved to fds 3 and 4) and reads the
outcome from fd 4. Steps, in order:

1. ``unshare`` new mount, network, PID, IPC and UTS namespaces (plus a user namespace with an
   identity uid/gid mapping when not root, so that the mounts below are allowed), and set the new
   IPC namespace's limits (``IPC_LIMITS``: SysV shared memory, message queues, semaphores) so that
   IPC objects, which outlive the processes that made them and escape RLIMIT_AS, stay small (where
   an unprivileged user namespace may not set them, seccomp refuses ``shmget`` and ``msgget``);
2. build a new root on a tmpfs mounted over the host's private temporary directory: read-only,
   nosuid, nodev bind mounts of the directories the interpreter needs (``binds``), an empty
   read-only tmpfs over each hidden directory below them (``masks``: site-packages and the
   rollforge package, which holds what the grader knows), the device nodes ``/dev/null``,
   ``/dev/zero``, ``/dev/urandom``, ``/dev/random``, and a size-limited tmpfs at the job's
   ``scratch`` folder (``runner.SCRATCH_DIR``) holding the job's files; ``pivot_root`` into it,
   detach the old root and make the scratch folder the working directory;
3. fork an init, PID 1 of the new PID namespace (killed when the launcher dies); when it exits
   or is killed, the kernel kills every process left in the namespace. Init forks the program,
   which sets the rlimits, drops to the unprivileged uid (as root) or loses its capabilities at
   ``execve`` (user namespace), joins a new empty session keyring, sets ``no_new_privs``, adds
   Landlock rules where the kernel has Landlock (``_landlock.py``), installs the seccomp filter
   (``_seccomp.py``) and executes;
4. init reaps orphans until the program ends, then writes ``{"exit": code}`` or
   ``{"signal": number}`` to fd 4 and exits. Setup failures are written as
   ``{"setup_error": message}`` instead.

The host enforces the wall time; as a backstop the launcher dies with the host (parent-death
signal) and on its own alarm a few seconds after the wall time, taking the jail with it.

fd 3 (the report channel) is left open for the program; fd 4 is close-on-exec.
"""

import ctypes
import json
import os
import platform
import resource
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's directory out
import _landlock  # noqa: E402  (sibling files; the launcher runs without its package)
from _seccomp import install_filter  # noqa: E402

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT = 1, 2, 4, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}
KEYCTL_JOIN_SESSION_KEYRING = 1
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "ppc64le": 203, "s390x": 217}

DEVICES = ("null", "zero", "urandom", "random")
#: Limits of the jail's own IPC namespace (/proc/sys/kernel/...): 16 MiB of SysV shared memory in
#: at most 16 segments, 16 message queues of 64 KiB, 16 semaphore sets of 32 semaphores.
IPC_LIMITS = {
    "shmmax": str(16 << 20),
    "shmall": str((16 << 20) // os.sysconf("SC_PAGE_SIZE")),
    "shmmni": "16",
    "msgmni": "16",
    "msgmnb": str(64 << 10),
    "msgmax": str(8 << 10),
    "sem": "32 256 32 16",
}
STATUS_FD, REPORT_FD = 4, 3

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(errno)} (errno {errno})")


def _encode(text):
    return None if text is None else text.encode()


def _mount(source, target, fstype, flags, data=None):
    _check(
        _libc.mount(_encode(source), _encode(target), _encode(fstype), ctypes.c_ulong(flags), _encode(data)),
        f"mount {source or fstype} on {target}",
    )


def _write(path, text):
    with open(path, "w") as handle:
        handle.write(text)


def _enter_namespaces(root_user):
    """Enter the new namespaces; True when the IPC namespace's limits are set (always as root; an
    unprivileged user namespace may not be allowed to, and SysV IPC is then refused by seccomp)."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS
    uid, gid = os.getuid(), os.getgid()
    if not root_user:
        flags |= CLONE_NEWUSER
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare(namespaces)")
    if not root_user:  # identity mapping: capabilities in the namespace until execve
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    try:
        for name, value in IPC_LIMITS.items():  # ipc sysctls act on the writer's (new) IPC namespace
            _write(f"/proc/sys/kernel/{name}", value)
    except PermissionError:
        if root_user:
            raise
        return False
    return True


def _bind_readonly(source, target, is_file=False):
    if is_file:
        open(target, "a").close()
    else:
        os.makedirs(target, exist_ok=True)
    _mount(source, target, None, MS_BIND)
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | (0 if is_file else MS_NODEV)
    _mount(None, target, None, flags)


def _mask(new_root, path):
    """Hide the directory ``path`` (when it is inside a bind) under an empty, read-only tmpfs.

    A nested mount namespace (which the seccomp filter refuses anyway) could not peel the mask
    off: mounts inherited from a more privileged namespace are locked together.
    """
    inside = new_root + path
    if not os.path.isdir(inside):
        return
    if os.path.realpath(inside) != inside:  # a link would point the mask outside the jail
        raise SetupError(f"cannot hide {path}: it resolves to {os.path.realpath(inside)} in the jail")
    _mount("tmpfs", inside, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=1,mode=0555")


def _build_root(job):
    new_root, scratch, limits = job["root"], job["scratch"], job["limits"]
    for path in job["binds"]:  # the scratch tmpfs would cover it
        if path == scratch or path.startswith(scratch + "/"):
            raise SetupError(
                f"the jail needs {path}, which lies under its scratch folder {scratch}: "
                "use a Python installed elsewhere"
            )
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    _mount("tmpfs", new_root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for path in job["binds"]:
        inside = new_root + path
        if os.path.islink(path):  # /bin -> usr/bin: keep the link, the target is bound anyway
            os.makedirs(os.path.dirname(inside), exist_ok=True)
            os.symlink(os.readlink(path), inside)
        elif os.path.isdir(path):
            _bind_readonly(path, inside)
    for path in job["masks"]:
        _mask(new_root, path)
    os.makedirs(new_root + "/dev", exist_ok=True)
    for device in DEVICES:
        _bind_readonly("/dev/" + device, f"{new_root}/dev/{device}", is_file=True)
    scratch_here = new_root + scratch
    os.makedirs(scratch_here)
    tmpfs = f"size={limits['disk_bytes']},nr_inodes={limits['max_files']},mode=0700"
    _mount("tmpfs", scratch_here, "tmpfs", MS_NOSUID | MS_NODEV, tmpfs)
    for name, content in job["files"].items():
        path = os.path.join(scratch_here, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _write(path, content)
    for directory, _, names in os.walk(scratch_here):
        for name in [directory, *(os.path.join(directory, n) for n in names)]:
            os.chown(name, job["uid"], job["gid"])
    os.makedirs(new_root + "/.old_root")
    _pivot(new_root, scratch)
    _mount(None, "/", None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _pivot(new_root, scratch):
    number = SYS_PIVOT_ROOT.get(platform.machine())
    os.chdir(new_root)
    if number is None:  # no pivot_root number known: chroot (the program holds no capability)
        os.chroot(".")
    else:
        _check(_libc.syscall(ctypes.c_long(number), b".", b".old_root"), "pivot_root")
        os.chroot(".")
        _check(_libc.umount2(b"/.old_root", ctypes.c_int(MNT_DETACH)), "umount old root")
        os.rmdir("/.old_root")
    os.chdir(scratch)


def _limit(kind, value):
    resource.setrlimit(kind, (value, value))


def _exec_program(job, root_user, ipc_limited):
    limits = job["limits"]
    cpu = int(limits["cpu_seconds"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))  # SIGXCPU, then SIGKILL
    _limit(resource.RLIMIT_AS, limits["memory_bytes"])
    _limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    _limit(resource.RLIMIT_NOFILE, limits["open_files"])
    _limit(resource.RLIMIT_NPROC, limits["processes"])
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_MSGQUEUE, 0)  # no POSIX message queues
    if root_user:
        os.setgroups([])
        os.setresgid(job["gid"], job["gid"], job["gid"])
        os.setresuid(job["uid"], job["uid"], job["uid"])
    _join_new_session_keyring()
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(no_new_privs)")
    _landlock.restrict(job["binds"], [f"/dev/{name}" for name in DEVICES], [job["scratch"]])
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for signum in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(signum, signal.SIG_DFL)
    install_filter(() if ipc_limited else ("shmget", "msgget"))  # last: it refuses calls made above
    os.execve(job["argv"][0], job["argv"], job["env"])


def _join_new_session_keyring():
    """Leave the launcher's session keyring (the host's) for a new, empty, anonymous one."""
    number = SYS_KEYCTL.get(platform.machine())
    if number is not None and _libc.syscall(ctypes.c_long(number), KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        errno = ctypes.get_errno()
        if errno != 38:  # ENOSYS: a kernel without keyrings
            raise SetupError(f"keyctl(join_session_keyring): {os.strerror(errno)}")


def _place_fds(report, status):
    """Move the two pipe ends the host passed to fds 3 (inherited) and 4 (close-on-exec)."""
    import fcntl

    high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (report, status)]
    os.close(report)
    os.close(status)
    for fd, target in zip(high, (REPORT_FD, STATUS_FD)):
        os.dup2(fd, target)
        os.close(fd)
    os.set_inheritable(STATUS_FD, False)


def main():
    # Should the host die without killing us, die too (and so the jail, through init's own
    # parent-death signal); the alarm below is a second bound on a jail nobody waits for.
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(pdeathsig)")
    _place_fds(int(sys.argv[1]), int(sys.argv[2]))
    status = os.fdopen(STATUS_FD, "w")
    try:
        job = json.loads(sys.stdin.read())
        root_user = os.getuid() == 0
        ipc_limited = _enter_namespaces(root_user)
        _build_root(job)
    except (SetupError, OSError, KeyError, ValueError) as exc:
        status.write(json.dumps({"setup_error": f"{type(exc).__name__}: {exc}"}))
        return 125
    init = os.fork()
    if init == 0:
        code = 127
        try:
            code = _init(job, root_user, ipc_limited, status)
        finally:
            os._exit(code)
    signal.alarm(int(job["limits"]["wall_seconds"]) + 5)  # SIGALRM's default action ends the launcher
    os.waitpid(init, 0)
    return 0


def _init(job, root_user, ipc_limited, status):
    """PID 1 of the jail: start the program, reap every orphan, report the program's end.

    A separate init keeps the program's signals ordinary (PID 1 ignores signals it has no handler
    for, SIGXCPU included), and its exit tears the namespace down with everything left in it.
    """
    _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(pdeathsig)")
    program = os.fork()
    if program == 0:
        try:
            _exec_program(job, root_user, ipc_limited)
        except BaseException as exc:  # report and die: never fall back into the launcher's code
            os.write(2, f"sandbox: could not start the program: {exc}\n".encode())
        os._exit(126)
    while True:
        pid, wait_status = os.wait()
        if pid == program:
            break
    if os.WIFSIGNALED(wait_status):
        status.write(json.dumps({"signal": os.WTERMSIG(wait_status)}))
    else:
        status.write(json.dumps({"exit": os.WEXITSTATUS(wait_status)}))
    status.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
