"""Run untrusted programs in a Linux sandbox: ``run_sandboxed(files, argv, limits)``.

Design: the host side (this module) starts ``_launcher.py`` in a new session with the job on stdin
and three pipes besides stdout/stderr: fd 3, a *report* channel the program may write structured
results to (the ``python_code`` harness does), and fd 4, on which the launcher writes how the
program ended (or why the jail could not be built). The host reads all pipes with byte caps, kills
the whole process group at the wall-time limit or when the output cap is exceeded, and always
reaps the launcher before returning; killing the launcher kills the jail's PID 1 (parent-death
signal), and the kernel then kills every process left in the jail's PID namespace.

What the jail contains (built by ``_launcher.py``; the tests in ``tests/envs/test_sandbox.py`` try
each escape):

- filesystem: a private root with read-only, nosuid binds of the interpreter's directories
  (``/usr``, ``/lib*``, ``/bin``, the Python prefix), four device nodes, and ``SCRATCH_DIR``
  (``/sandbox``), a private tmpfs of ``disk_bytes`` / ``max_files``, the program's working
  directory and the only writable place. No ``/etc``, ``/home``, ``/root``, ``/tmp``, ``/proc``,
  ``/sys`` or host project files are visible, and every site-packages directory, ``sys.path``
  entry and the rollforge package are hidden under empty read-only mounts (``_masks``): what a
  grader knows (``python_code``'s hidden tests and reference solutions live in rollforge) is
  never readable inside, in an editable or a regular install.
  Where the kernel has Landlock, the same layout is enforced a second time per path lookup;
- network: a new network namespace with no interface up (not even loopback): no connection to the
  host's 127.0.0.1 or anywhere else, no DNS, no abstract Unix sockets of the host; Landlock (ABI
  4+) refuses every TCP bind and connect as well;
- processes: a new PID namespace (the host's processes are invisible and unsignalable), a uid
  used by no earlier run since boot (as root: a counter in ``_UID_FILE``) or, as non-root, the
  caller's uid in a new user namespace per run (user keyrings are per namespace), no
  capabilities, ``no_new_privs``; RLIMIT_NPROC bounds fork bombs, and nothing survives the run;
- kernel interfaces: a seccomp filter (``_seccomp.py``, x86_64 and aarch64) refuses keyrings,
  namespace creation, mounts, ``memfd_create``, ``ptrace``, ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``io_uring`` and module loading, and kills calls made through another ABI;
  each run also gets a new empty session keyring;
- resources: RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_CORE=0,
  RLIMIT_MSGQUEUE=0, a wall-time limit and a cap on stdout+stderr bytes; private IPC and UTS
  namespaces, the IPC one limited to 16 MiB of SysV shared memory (segments outlive processes
  and are not counted in RLIMIT_AS; where an unprivileged user namespace may not set the limits,
  seccomp refuses ``shmget`` and ``msgget``).

Not contained: the program runs on the host kernel, so a kernel exploit through an allowed call
escapes (the filter is a deny list, not an allow list); the read-only binds expose the rest of the
interpreter's installation (its stdlib, ``/usr``) for reading; CPU time is per process (up to
``processes`` x ``cpu_seconds`` in total, still bounded by the wall time); memory is per process
address space (up to ``processes`` x ``memory_bytes`` in total), not a cgroup total; timing and
other side channels are open. Python installed under ``/sandbox`` cannot run in the jail (the
scratch tmpfs would cover it; the run fails with a line naming the bound path). The jail needs
Linux with mount/PID/network namespaces: as root directly, as another user through an
unprivileged user namespace (where RLIMIT_NPROC then counts that user's processes in the jail's
namespace). ``sandbox_support()`` says whether it works here.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Mapping, Sequence

from ...errors import ConfigError, SandboxUnavailable
from ._pipes import read_capped

__all__ = ["SCRATCH_DIR", "SandboxLimits", "SandboxResult", "SandboxUnavailable", "run_sandboxed", "sandbox_support"]

#: The jail's scratch folder, the same on every machine (the model sees it). Bound host paths
#: keep their names in the jail, so it must be a place no installation uses: not ``/work``,
#: ``/workspace``, ``/app``, ``/opt``, ``/home``, ``/tmp`` (common Docker WORKDIRs, venv and pytest
#: folders) nor a system folder; nothing in the Linux filesystem layout, a distribution, pyenv,
#: conda or uv puts anything at ``/sandbox``.
SCRATCH_DIR = "/sandbox"
_LAUNCHER = Path(__file__).with_name("_launcher.py")
_REPORT_FD, _STATUS_FD = 3, 4
_REPORT_CAP = 1 << 20
_PACKAGE_DIR = Path(__file__).resolve().parents[2]
_BASE_UID = 1_200_000  # per-run uids above any real account: RLIMIT_NPROC counts per uid
_LAST_UID = 2**32 - 2  # (uid_t)-1 means "no uid"
#: The uid counter; /run is a tmpfs, emptied at boot, when no process of an old uid is left.
_UID_FILE = Path("/run/rollforge/sandbox-uid-counter")
_uid_lock = threading.Lock()


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run."""

    #: CPU seconds per process (RLIMIT_CPU; SIGXCPU then SIGKILL).
    cpu_seconds: int = 5
    #: Seconds of wall time before the whole jail is killed.
    wall_seconds: float = 10.0
    #: Address-space bytes per process (RLIMIT_AS).
    memory_bytes: int = 512 << 20
    #: Processes and threads of the run's uid (RLIMIT_NPROC).
    processes: int = 16
    #: Bytes of stdout plus stderr kept; more kills the run.
    output_bytes: int = 64 << 10
    #: Largest file the program may write (RLIMIT_FSIZE).
    file_bytes: int = 4 << 20
    #: Size of the private scratch tmpfs (``SCRATCH_DIR``).
    disk_bytes: int = 16 << 20
    #: Inodes of the private scratch tmpfs.
    max_files: int = 256
    #: Open file descriptors per process (RLIMIT_NOFILE).
    open_files: int = 64

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
            if name != "wall_seconds" and not isinstance(value, int):
                raise ConfigError(f"SandboxLimits.{name} must be an int, got {value!r}")


Outcome = Literal["exited", "signaled", "timeout", "output_limit"]


@dataclass(frozen=True)
class SandboxResult:
    """How a sandboxed run ended. ``exit_code`` is None unless ``outcome == "exited"``."""

    outcome: Outcome
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    #: What the program wrote to fd 3 (the report channel), decoded.
    report: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.outcome == "exited" and self.exit_code == 0

    def describe(self) -> str:
        """One line for an observation: how the run ended."""
        if self.outcome == "exited":
            return f"exit status {self.exit_code}"
        if self.outcome == "timeout":
            return "killed: wall-time limit exceeded"
        if self.outcome == "output_limit":
            return "killed: output limit exceeded"
        try:
            name = signal.Signals(self.signal).name
        except ValueError:
            name = str(self.signal)
        hint = {signal.SIGXCPU: " (CPU-time limit)", signal.SIGKILL: " (CPU-time hard limit or out of memory)"}
        return f"killed by signal {name}{hint.get(self.signal, '')}"


def _binds() -> list[str]:
    paths = ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"]
    for prefix in (sys.base_prefix, sys.prefix, str(Path(sys.executable).resolve().parent.parent)):
        if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
            paths.append(prefix)
    return [p for p in paths if os.path.lexists(p)]


def _interpreter_dirs() -> set[str]:
    """The folder of ``sys.executable`` as the jail starts it and of every link on the way to the
    binary (a venv's ``bin/python3`` -> ``/usr/bin/python3.11``), resolved. A console script puts
    its own folder (a venv's ``bin``) first on ``sys.path``: hiding it would hide the interpreter."""
    dirs = set()
    path = os.path.abspath(sys.executable)
    for _ in range(40):  # the kernel follows at most 40 links (ELOOP)
        dirs.add(os.path.realpath(os.path.dirname(path)))
        if not os.path.islink(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    dirs.add(os.path.dirname(os.path.realpath(sys.executable)))
    return dirs


def _masks() -> list[str]:
    """Directories to hide below the binds: every place installed packages live (site-packages,
    ``sys.path``) and the rollforge package itself, which holds the grader's hidden tests and
    reference solutions. What the interpreter needs (its stdlib, extension modules, shared library,
    the folders of its executable and of every link to it, and the bound system directories) stays
    visible, and so does every folder above them."""
    needed = {
        os.path.realpath(p)
        for p in (
            os.path.dirname(os.__file__),  # the stdlib (a venv's sysconfig points into the venv)
            sysconfig.get_path("stdlib"),
            sysconfig.get_config_var("DESTSHARED") or "/usr/lib",  # extension modules (lib-dynload)
            sysconfig.get_config_var("LIBDIR") or "/usr/lib",
            *_binds(),
        )
    } | _interpreter_dirs()
    candidates = [*site.getsitepackages(), site.getusersitepackages(), *sys.path, str(_PACKAGE_DIR)]
    masks = []
    for candidate in candidates:
        path = os.path.realpath(candidate) if candidate else ""
        if not os.path.isdir(path) or path == "/" or path in masks:
            continue
        if any(n == path or n.startswith(path + "/") for n in needed):  # would hide the interpreter
            continue
        masks.append(path)
    return masks


def _next_uid() -> int:
    """A uid no earlier run on this host since boot has had (so no keyring, IPC object or process
    count of an earlier run is shared): a counter in ``_UID_FILE``, under a lock between processes."""
    with _uid_lock:
        try:
            _UID_FILE.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            descriptor = os.open(_UID_FILE, os.O_RDWR | os.O_CREAT, 0o600)
            with open(descriptor, "r+b") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                text = handle.read().strip()
                used = int(text) if text.isdigit() else 0
                handle.seek(0)
                handle.truncate()
                handle.write(str(used + 1).encode())
        except OSError as exc:
            raise SandboxUnavailable(f"the sandbox keeps its uid counter at {_UID_FILE} and cannot: {exc}") from exc
    if _BASE_UID + used > _LAST_UID:
        raise SandboxUnavailable(f"the sandbox has used every uid from {_BASE_UID} to {_LAST_UID}; reset {_UID_FILE}")
    return _BASE_UID + used


def run_sandboxed(
    files: Mapping[str, str],
    argv: Sequence[str],
    limits: SandboxLimits = SandboxLimits(),
    *,
    env: Mapping[str, str] | None = None,
) -> SandboxResult:
    """Run ``argv`` in a fresh jail whose ``SCRATCH_DIR`` holds ``files`` (relative path -> text).

    ``argv[0]`` must be an absolute path visible inside the jail (``sys.executable`` is). Blocks
    for at most about ``limits.wall_seconds``; raises ``SandboxUnavailable`` when the jail cannot
    be built here, ``ConfigError`` for bad arguments.
    """
    if not argv or not all(isinstance(a, str) for a in argv) or not os.path.isabs(argv[0]):
        raise ConfigError(f"argv must be a list of str starting with an absolute path, got {argv!r}")
    for name in files:
        if not isinstance(name, str) or os.path.isabs(name) or ".." in Path(name).parts or not name:
            raise ConfigError(f"sandbox file names must be relative paths inside {SCRATCH_DIR}, got {name!r}")
    size = sum(len(str(content).encode()) for content in files.values())
    if size > limits.disk_bytes // 2:
        raise ConfigError(
            f"the sandbox files hold {size} bytes; keep them under half of disk_bytes ({limits.disk_bytes})"
        )
    uid = _next_uid() if os.getuid() == 0 else os.getuid()
    gid = uid if os.getuid() == 0 else os.getgid()
    base_env = {"PATH": "/usr/bin:/bin", "HOME": SCRATCH_DIR, "TMPDIR": SCRATCH_DIR, "LANG": "C.UTF-8"}
    root = tempfile.mkdtemp(prefix="rollforge-sandbox-")
    job = {
        "root": root,
        "scratch": SCRATCH_DIR,
        "files": dict(files),
        "argv": list(argv),
        "env": {**base_env, **(env or {})},
        "binds": _binds(),
        "masks": _masks(),
        "uid": uid,
        "gid": gid,
        "limits": asdict(limits),
    }
    try:
        return _run(job, limits)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _run(job: dict, limits: SandboxLimits) -> SandboxResult:
    report_r, report_w = os.pipe()
    status_r, status_w = os.pipe()
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_LAUNCHER), str(report_w), str(status_w)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(report_w, status_w),
            start_new_session=True,  # its process group is killed as a whole
            env={"LANG": "C.UTF-8"},
        )
    finally:
        os.close(report_w)
        os.close(status_w)
    try:
        process.stdin.write(json.dumps(job).encode())
        process.stdin.close()
    except BrokenPipeError:
        pass
    streams = read_capped(
        process,
        {"stdout": process.stdout.fileno(), "stderr": process.stderr.fileno(), "report": report_r, "status": status_r},
        caps={"stdout": limits.output_bytes, "stderr": limits.output_bytes, "report": _REPORT_CAP, "status": 1 << 16},
        shared_cap=("stdout", "stderr", limits.output_bytes),
        deadline=started + limits.wall_seconds,
    )
    seconds = time.monotonic() - started
    text = {name: data.decode("utf-8", "replace") for name, data in streams.data.items()}
    try:
        status = json.loads(text["status"]) if text["status"].strip() else {}
    except ValueError:  # cut short by a kill
        status = {}
    if "setup_error" in status:
        raise SandboxUnavailable(f"the sandbox could not be built here: {status['setup_error']}")
    common = dict(stdout=text["stdout"], stderr=text["stderr"], report=text["report"], seconds=seconds)
    if streams.stopped == "timeout":
        return SandboxResult("timeout", None, None, **common)
    if streams.stopped == "output_limit":
        return SandboxResult("output_limit", None, None, **common)
    if "exit" in status:
        return SandboxResult("exited", int(status["exit"]), None, **common)
    if "signal" in status:
        return SandboxResult("signaled", None, int(status["signal"]), **common)
    raise SandboxUnavailable(
        f"the sandbox launcher ended without a status (return code {process.returncode}): {text['stderr'][-500:]}"
    )


_support: list[str | None] = []


def sandbox_support() -> str | None:
    """None when sandboxed runs work here, else why not (checked once per process by running
    ``python -c pass`` in a jail)."""
    if not _support:
        reason: str | None = None
        if not sys.platform.startswith("linux"):
            reason = f"the sandbox needs Linux namespaces; this is {sys.platform}"
        else:
            try:
                result = run_sandboxed({}, [sys.executable, "-I", "-S", "-c", "pass"])
                if not result.ok:
                    reason = f"a trivial program failed in the sandbox: {result.describe()}: {result.stderr[-300:]}"
            except SandboxUnavailable as exc:
                reason = str(exc)
        _support.append(reason)
    return _support[0]
