"""The sandbox: each escape an untrusted program might try is attempted here and must fail.

Every attempt runs with small limits (a few processes, 1-3 s, 128 MiB) so that a containment bug
cannot harm the machine running the tests; network attempts only target a socket this test
opened on 127.0.0.1.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import site
import socket
import sys
import sysconfig
import textwrap
import uuid
from pathlib import Path

import pytest

from rollforge.envs.sandbox import (
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    _seccomp,
    run_sandboxed,
    runner,
    sandbox_support,
)
from rollforge.errors import ConfigError

pytestmark = pytest.mark.skipif(sandbox_support() is not None, reason=f"no sandbox here: {sandbox_support()}")

# The wall time only matters when something goes wrong; it is generous for loaded CI machines.
SMALL = SandboxLimits(cpu_seconds=2, wall_seconds=8.0, memory_bytes=128 << 20, processes=8, output_bytes=4096)
# For a run its wall time ends: long enough to start two interpreters on a loaded machine.
SHORT = SandboxLimits(cpu_seconds=2, wall_seconds=5.0, memory_bytes=128 << 20, processes=8, output_bytes=4096)


def run(code: str, limits: SandboxLimits = SMALL, **files: str) -> SandboxResult:
    return run_sandboxed({"main.py": textwrap.dedent(code), **files}, [sys.executable, "-I", "-S", "main.py"], limits)


def processes_with(marker: str) -> list[int]:
    """Host processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def landlock_abi() -> int:
    """The Landlock ABI version of this kernel, 0 without Landlock."""
    return max(ctypes.CDLL(None, use_errno=True).syscall(444, None, 0, 1), 0)


# -- what works -----------------------------------------------------------------------------------


def test_runs_a_program_and_returns_its_streams_and_status():
    result = run(
        """
        import os, sys
        print("out", open("data.txt").read())
        print("err", file=sys.stderr)
        os.write(3, b'{"report": 1}')
        open("new.txt", "w").write("scratch space is writable")
        sys.exit(3)
        """,
        **{"data.txt": "hello"},
    )
    assert (result.outcome, result.exit_code, result.signal) == ("exited", 3, None)
    assert result.stdout == "out hello\n" and result.stderr == "err\n"
    assert result.report == '{"report": 1}'
    assert result.describe() == "exit status 3" and not result.ok


#: Top-level directories of the Python installation, bound read-only into the jail (e.g. usr,
#: opt or root for pyenv; tmp for a virtualenv under /tmp).
PYTHON_HOMES = {Path(p).parts[1] for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}


def test_the_program_sees_a_private_root_as_an_unprivileged_user():
    result = run(
        """
        import json, os
        print(json.dumps([os.getcwd(), os.getpid(), os.getuid(), os.listdir("/"), os.listdir("/sandbox"),
                          os.environ["HOME"], os.environ["TMPDIR"]]))
        """
    )
    assert result.ok, result.stderr
    cwd, pid, uid, top, scratch, home, temp = json.loads(result.stdout)
    assert (cwd, pid, scratch, home, temp) == ("/sandbox", 2, ["main.py"], "/sandbox", "/sandbox")  # PID 1: init
    assert uid != 0
    assert set(top) - PYTHON_HOMES <= {"bin", "sbin", "lib", "lib32", "lib64", "usr", "dev", "sandbox"}
    assert {"dev", "sandbox", "usr"} <= set(top)


# -- filesystem -----------------------------------------------------------------------------------


def test_cannot_read_files_outside_its_directory(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP SECRET")
    project = Path(__file__).resolve()
    result = run(
        f"""
        import os
        for path in ["/etc/passwd", "/etc/shadow", {str(secret)!r}, {str(project)!r}, "/proc/1/environ",
                     "/root/.bashrc", "/sandbox/../etc/hostname"]:
            try:
                open(path).read()
                print("READ", path)
            except OSError as exc:
                print("blocked", type(exc).__name__)
        for path in ["/tmp", "/home", {str(tmp_path)!r}, "/proc", "/sys"]:
            print("listed" if os.path.exists(path) else "absent", path)
        """
    )
    assert result.ok, result.stderr
    assert "READ" not in result.stdout and result.stdout.count("blocked") == 7
    listed = {line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("listed")}
    # only a directory that holds the (read-only) Python installation may show, e.g. /tmp for a venv there
    assert {Path(p).parts[1] for p in listed} <= PYTHON_HOMES and str(tmp_path) not in listed


def test_cannot_write_outside_its_directory(tmp_path):
    result = run(
        f"""
        for path in ["/evil", "/usr/evil", "/dev/evil", {str(tmp_path / "evil")!r}, "/bin/python3"]:
            try:
                open(path, "a").write("x")
                print("WROTE", path)
            except OSError as exc:
                print("blocked", exc.errno)
        """
    )
    assert result.ok, result.stderr
    assert "WROTE" not in result.stdout and result.stdout.count("blocked") == 5
    assert not (tmp_path / "evil").exists()


def test_cannot_regain_privileges():
    result = run(
        """
        import os
        device = 0o600 | 0o60000, os.makedev(8, 0)
        for attempt in (lambda: os.setuid(0), lambda: os.chroot("/sandbox"), lambda: os.mknod("/sandbox/sda", *device)):
            try:
                attempt()
                print("SUCCEEDED")
            except OSError as exc:
                print("blocked", exc.errno)
        """
    )
    assert result.ok, result.stderr
    assert result.stdout == "blocked 1\n" * 3


def test_a_nested_user_namespace_cannot_unlock_the_read_only_mounts():
    # Creating a user namespace is allowed (no seccomp filter) and gives capabilities over new
    # namespaces only: the jail's mounts stay locked read-only and cannot be peeled off.
    result = run(
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        def call(result):
            return "ok" if result == 0 else os.strerror(ctypes.get_errno())
        print(call(libc.unshare(0x10000000 | 0x00020000)))  # CLONE_NEWUSER | CLONE_NEWNS
        print(call(libc.mount(None, b"/usr", None, ctypes.c_ulong(4096 | 32), None)))  # MS_BIND | MS_REMOUNT
        print(call(libc.mount(None, b"/", None, ctypes.c_ulong(4096 | 32), None)))
        print(call(libc.umount2(b"/sandbox", 2)))  # MNT_DETACH
        try:
            open("/usr/evil", "w")
            print("WROTE")
        except OSError as exc:
            print(exc.strerror)
        """
    )
    assert result.ok, result.stderr
    unshared, *attempts, write = result.stdout.splitlines()
    assert unshared in ("ok", "Operation not permitted")  # the latter where user namespaces are off
    assert all(a in ("Operation not permitted", "Invalid argument") for a in attempts) and len(attempts) == 3
    assert write == "Read-only file system"


def test_disk_use_is_bounded():
    result = run(
        """
        import errno
        try:
            open("big", "wb").write(b"x" * (64 << 20))
        except OSError as exc:
            print("big file", errno.errorcode[exc.errno])
        try:
            for i in range(100000):
                open(f"f{i}", "w").close()
        except OSError as exc:
            print("many files", errno.errorcode[exc.errno])
        """
    )
    assert result.ok, result.stderr
    assert result.stdout == "big file EFBIG\nmany files ENOSPC\n"


# -- network --------------------------------------------------------------------------------------


def test_cannot_reach_the_network():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        result = run(
            f"""
            import socket
            for family, address in [(socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_INET, ("1.1.1.1", 53))]:
                with socket.socket(family) as s:
                    s.settimeout(1)
                    try:
                        s.connect(address)
                        print("CONNECTED", address)
                    except OSError as exc:
                        print("blocked", type(exc).__name__)
            try:
                socket.getaddrinfo("pypi.org", 443)
                print("RESOLVED")
            except OSError:
                print("blocked dns")
            """
        )
        server.settimeout(0.2)
        with pytest.raises(socket.timeout):
            server.accept()
    assert result.ok, result.stderr
    # OSError: no route (the namespace has no interface up); PermissionError: Landlock refused first
    blocked = "PermissionError" if landlock_abi() >= 4 else "OSError"
    assert result.stdout == f"blocked {blocked}\nblocked {blocked}\nblocked dns\n"


def test_cannot_reach_host_unix_sockets():
    name = f"\0rollforge-test-{uuid.uuid4().hex}"  # abstract: no file, scoped by network namespace
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(name)
        server.listen()
        result = run(
            f"""
            import socket
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect({name!r})
                    print("CONNECTED")
                except OSError as exc:
                    print("blocked", type(exc).__name__)
            """
        )
    assert result.ok, result.stderr
    assert result.stdout == "blocked ConnectionRefusedError\n"


# -- processes ------------------------------------------------------------------------------------


def test_host_processes_are_invisible_and_unsignalable():
    result = run(
        f"""
        import os
        try:
            os.kill({os.getpid()}, 0)
            print("SEES HOST")
        except ProcessLookupError:
            print("blocked")
        try:
            os.kill(1, 9)
        except PermissionError:
            print("init protected")
        """
    )
    assert result.ok, result.stderr
    assert result.stdout == "blocked\ninit protected\n"


@pytest.mark.parametrize("ending", ["exit", "timeout"])
def test_leaves_no_process_behind(ending):
    """A daemon (its own session, orphaned) is running, as its ``alive`` file shows, when the
    program exits or is killed for its wall time; afterwards no process with its marker is left."""
    marker = f"rollforge-daemon-{uuid.uuid4().hex}"
    result = run(
        f"""
        import os, sys, time
        if os.fork() == 0:
            os.setsid()  # a daemon: its own session, orphaned when its parent exits
            if os.fork() == 0:
                daemon = "open('alive', 'w').close(); import time; time.sleep(30)"
                os.execv(sys.executable, [sys.executable, "-c", daemon, {marker!r}])
            os._exit(0)
        while not os.path.exists("alive"):  # the daemon runs, with the marker in its command line
            time.sleep(0.01)
        print("daemon started", flush=True)
        if {ending!r} == "timeout":
            time.sleep(30)
        """,
        SHORT,
    )
    assert result.stdout == "daemon started\n", (result.outcome, result.stderr)
    assert result.outcome == ("exited" if ending == "exit" else "timeout")
    assert processes_with(marker) == []


def test_process_count_is_limited():
    result = run(
        """
        import os, time
        made = 0
        for _ in range(50):
            try:
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                made += 1
            except OSError as exc:
                print("fork failed:", exc.strerror)
                break
        print(made)
        """
    )
    assert result.ok, result.stderr
    failed, made = result.stdout.splitlines()
    assert failed == "fork failed: Resource temporarily unavailable"
    assert int(made) == SMALL.processes - 1  # the program itself is the first process of its uid


@pytest.mark.timeout(120)  # only catches a bomb that is not contained: the run would never return
def test_fork_bomb_is_contained():
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=1.5, memory_bytes=128 << 20, processes=8)
    result = run(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        limits,
    )
    assert result.outcome in ("timeout", "signaled")  # wall time, or SIGXCPU of the first process


# -- resources ------------------------------------------------------------------------------------


def test_cpu_time_is_limited():
    result = run("while True: pass", SandboxLimits(cpu_seconds=1, wall_seconds=30))
    # SIGXCPU, not the wall time: the CPU limit ended the run (on a loaded machine 1 CPU second
    # may take several wall seconds, hence the generous wall limit).
    assert result.outcome == "signaled" and result.describe() == "killed by signal SIGXCPU (CPU-time limit)"


def test_wall_time_is_limited():
    result = run("import time; print('started', flush=True); time.sleep(60)", SandboxLimits(wall_seconds=1))
    assert result.outcome == "timeout" and result.stdout == "started\n"  # not the 60 s of its sleep
    assert result.seconds >= 1  # never before the limit
    assert result.describe() == "killed: wall-time limit exceeded"


def test_memory_is_limited():
    result = run("x = bytearray(1 << 30)\nprint('ALLOCATED')")
    assert result.exit_code == 1 and "MemoryError" in result.stderr and "ALLOCATED" not in result.stdout


def test_output_is_capped():
    result = run("import sys\nwhile True: sys.stdout.write('x' * 1000); sys.stderr.write('y' * 1000)")
    assert result.outcome == "output_limit"
    assert len(result.stdout) + len(result.stderr) == SMALL.output_bytes
    assert set(result.stdout) == {"x"}


def test_a_needed_folder_under_the_scratch_folder_is_refused_in_one_line(tmp_path, monkeypatch):
    # As if Python were installed under the jail's scratch folder, which the scratch tmpfs would cover.
    python_home = tmp_path / "python"
    python_home.mkdir()
    binds = runner._binds
    monkeypatch.setattr(runner, "SCRATCH_DIR", str(tmp_path))
    monkeypatch.setattr(runner, "_binds", lambda: [*binds(), str(python_home)])
    with pytest.raises(SandboxUnavailable) as info:
        run("pass")
    assert str(info.value) == (
        f"the sandbox could not be built here: SetupError: the jail needs {python_home}, which lies under its "
        f"scratch folder {tmp_path}: use a Python installed elsewhere"
    )


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="absolute path"):
        run_sandboxed({}, ["python"])
    with pytest.raises(ConfigError, match=r"relative paths inside /sandbox, got '\.\./x'"):
        run_sandboxed({"../x": ""}, [sys.executable])
    with pytest.raises(ConfigError, match="the sandbox files hold 9000 bytes; keep them under half of disk_bytes"):
        run_sandboxed({"big.txt": "x" * 9000}, [sys.executable], SandboxLimits(disk_bytes=16000))
    with pytest.raises(ConfigError, match="SandboxLimits.cpu_seconds must be a positive number, got 0"):
        SandboxLimits(cpu_seconds=0)
    with pytest.raises(ConfigError, match="SandboxLimits.processes must be an int, got 2.5"):
        SandboxLimits(processes=2.5)


# -- what the grader knows, and what outlives a run --------------------------------------------------


def test_installed_packages_and_rollforge_are_hidden():
    masks = runner._masks()
    package = Path(runner.__file__).resolve().parents[2]
    assert str(package) in masks
    assert {os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)} <= set(masks)
    interpreter = {
        sysconfig.get_path("stdlib"),
        sysconfig.get_config_var("DESTSHARED"),
        os.path.dirname(sys.executable),
    }
    assert not {os.path.realpath(p) for p in interpreter} & set(masks)
    # The directories are bound here only where they lie under a bound prefix (site-packages does).
    result = run(
        f"""
        import json, os
        for path in {masks!r}:
            print(path, os.listdir(path) if os.path.isdir(path) else "absent")
        try:
            open({str(package / "envs" / "library" / "python_code_tasks.py")!r})
            print("READ")
        except OSError as exc:
            print("blocked", type(exc).__name__)
        import math, select  # extension modules (lib-dynload) load too
        print(json.dumps("the stdlib still loads"))
        """
    )
    assert result.ok, result.stderr
    *listed, blocked, stdlib = result.stdout.splitlines()
    assert all(line.endswith(" []") or line.endswith(" absent") for line in listed), listed
    assert any(line.endswith(" []") for line in listed)  # at least site-packages was bound, and masked
    assert blocked == "blocked FileNotFoundError" and stdlib == '"the stdlib still loads"'


LIBC_CALLS = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(what, result):
    print(what, "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()])
    return result
"""


def test_sysv_shared_memory_is_bounded():
    # SysV segments outlive their processes and are not counted in RLIMIT_AS (1.6 GB resident
    # under a 512 MB limit before): the jail's IPC namespace holds 16 MiB of them in all.
    result = run(
        LIBC_CALLS
        + """
        IPC_PRIVATE, IPC_CREAT = 0, 0o1000
        call("1 GiB", libc.shmget(IPC_PRIVATE, ctypes.c_size_t(1 << 30), IPC_CREAT | 0o600))
        for i in range(3):
            call("8 MiB", libc.shmget(IPC_PRIVATE, ctypes.c_size_t(8 << 20), IPC_CREAT | 0o600))
        call("message queue", libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600))
        call("POSIX message queue", libc.syscall(240 if os.uname().machine == "x86_64" else 180, b"q", 0o100 | 2, 0o600, None))
        """.replace("\n        ", "\n")
    )
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == [
        "1 GiB EINVAL",  # above shmmax
        "8 MiB ok",
        "8 MiB ok",
        "8 MiB ENOSPC",  # above shmall
        "message queue ok",
        "POSIX message queue EMFILE",  # RLIMIT_MSGQUEUE is 0
    ]
    # Segments belong to the run's IPC namespace: the next run starts with none.
    again = run(LIBC_CALLS + "call('8 MiB', libc.shmget(0, ctypes.c_size_t(8 << 20), 0o1600))\n" * 2)
    assert again.stdout == "8 MiB ok\n8 MiB ok\n"


def test_keyrings_are_out_of_reach():
    # Keyrings are per uid and outlive runs: a key added in one run was read by a later one.
    add_key, keyctl, request_key = (248, 250, 249) if os.uname().machine == "x86_64" else (217, 219, 218)
    code = LIBC_CALLS + (
        f"call('add_key', libc.syscall({add_key}, b'user', b'rollforge', b'secret', 6, ctypes.c_int(-4)))\n"
        f"call('keyctl', libc.syscall({keyctl}, 0, ctypes.c_int(-3), 0))\n"  # get the session keyring's id
        f"call('request_key', libc.syscall({request_key}, b'user', b'rollforge', None, 0))\n"
    )
    for _ in range(2):
        result = run(code)
        assert result.stdout == "add_key EPERM\nkeyctl EPERM\nrequest_key EPERM\n", result.stderr


def test_every_run_gets_a_uid_never_used_before(monkeypatch, tmp_path):
    if os.getuid() != 0:
        pytest.skip("per-run uids are given as root; other users run as themselves in a user namespace")
    counter = tmp_path / "run" / "uid-counter"
    monkeypatch.setattr(runner, "_UID_FILE", counter)
    first = runner._next_uid()
    read, write = os.pipe()
    children = []
    for _ in range(2):  # other processes (equal PIDs mod 4096 once collided) share the counter
        pid = os.fork()
        if pid == 0:
            os.write(write, f"{runner._next_uid()}\n".encode())
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    os.close(write)
    others = [int(line) for line in os.read(read, 1000).split()]
    os.close(read)
    assert sorted([first, *others]) == [first, first + 1, first + 2] and first == runner._BASE_UID
    assert counter.read_text() == "3"
    uids = [int(run("import os; print(os.getuid())").stdout) for _ in range(2)]
    assert uids == [runner._BASE_UID + 3, runner._BASE_UID + 4]


def test_the_seccomp_filter_refuses_what_reaches_past_the_jail():
    numbers = _seccomp.ARCHES[os.uname().machine][1]
    probes = [
        "unshare",
        "setns",
        "mount",
        "umount2",
        "memfd_create",
        "ptrace",
        "bpf",
        "userfaultfd",
        "io_uring_setup",
        "perf_event_open",
        "open_by_handle_at",
        "process_vm_readv",
        "clone3",
    ]
    result = run(
        LIBC_CALLS
        + "".join(f"call({name!r}, libc.syscall({numbers[name]}, 0, 0, 0, 0, 0))\n" for name in probes)
        + "call('clone(CLONE_NEWUSER)', libc.syscall(%d, 0x10000000 | 17, 0, 0, 0, 0))\n" % numbers["clone"]
        + textwrap.dedent(
            """
            import subprocess, sys, threading
            thread = threading.Thread(target=print, args=("a thread runs",))
            thread.start()
            thread.join()
            print(subprocess.run([sys.executable, "-c", "print('a child runs')"], capture_output=True, text=True).stdout.strip())
            """
        )
    )
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:-3] == [f"{name} EPERM" for name in probes[:-1]] + ["clone3 ENOSYS"]
    assert lines[-3:] == ["clone(CLONE_NEWUSER) EPERM", "a thread runs", "a child runs"]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x32 ABI is an x86_64 matter")
def test_a_call_through_another_abi_kills_the_program():
    # x32 numbers (bit 30 set) would slip past a deny list written with the native numbers.
    result = run(LIBC_CALLS + "libc.syscall(0x40000000 | 250, 0, -3, 0)\nprint('SURVIVED')\n")
    assert result.outcome == "signaled" and result.signal == signal.SIGSYS and "SURVIVED" not in result.stdout


@pytest.mark.skipif(landlock_abi() < 4, reason="Landlock with TCP rules needs Linux 6.7+ with Landlock on")
def test_landlock_refuses_tcp_and_leaves_the_scratch_folder_fully_usable():
    result = run(
        """
        import os, socket
        for family, address in ((socket.AF_INET, ("0.0.0.0", 0)), (socket.AF_INET6, ("::", 0))):
            with socket.socket(family) as s:
                try:
                    s.bind(address)
                    print("BOUND")
                except OSError as exc:
                    print("bind", exc.strerror)
        os.mkfifo("fifo"); os.symlink("fifo", "link"); os.mkdir("d"); os.rename("d", "e"); os.link("main.py", "e/copy")
        os.truncate("e/copy", 0); os.chmod("main.py", 0o700)
        print(sorted(os.listdir(".")), len(open("/dev/urandom", "rb").read(4)), open("/dev/null", "w").write("x"))
        """
    )
    assert result.ok, result.stderr
    assert result.stdout.splitlines() == [
        "bind Permission denied",  # EACCES from Landlock (without it, binding works in the namespace)
        "bind Permission denied",
        "['e', 'fifo', 'link', 'main.py'] 4 1",
    ]
