"""The in-sandbox half of `envs.tools.sandbox.run_sandboxed`; not imported, run as a script:

    python -I -S sandbox_init.py CONFIG_JSON STATUS_FD

Standard library only, because it runs before (and instead of) any site-packages. With `isolate` it
  1. unshares user + mount + network + pid namespaces: we become root of a fresh user namespace whose network
     has only a downed loopback, so no connect() reaches the host, not even 127.0.0.1;
  2. forks the pid-namespace init, which makes every mount read-only, mounts private size-capped tmpfs on
     /tmp, /var/tmp, /dev/shm and /run, binds the writable dirs back read-write and mounts a fresh /proc;
  3. enters a second user namespace, so the program holds no privilege over those mounts and cannot undo them;
  4. forks the program with rlimits applied, reaps every process, and exits with the program's status. When
     init exits the kernel kills whatever the program left behind in its pid namespace (fork bombs included).
Without `isolate` it only applies the rlimits and execs the program. Either way one JSON line on STATUS_FD
reports {"isolation": ...} or {"error": ...} before the program starts.
"""

import ctypes
import json
import os
import re
import resource
import signal
import sys
import time

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC, MS_PRIVATE, MS_RELATIME = (
    1024,
    2048,
    4096,
    16384,
    1 << 18,
    1 << 21,
)
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
# statvfs flag -> the mount flag that keeps it. A remount must repeat the flags a user namespace inherited
# locked (nosuid, nodev, noexec, atime) or the kernel refuses it.
_KEEP_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
TMPFS_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run")
SANDBOX_UID = 1000  # the program's uid in the innermost user namespace: not root, so it has no capabilities

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    ret = _libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {target}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def _map_ids(inner_uid: int, outer_uid: int, outer_gid: int) -> None:
    """Map one id into the user namespace we just entered (the only mapping an unprivileged process may write)."""
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{inner_uid} {outer_uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{inner_uid} {outer_gid} 1")


def _mountpoints() -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f if line.strip()]
    return [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), p) for p in points]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _remount(path: str, readonly: bool) -> None:
    flags = os.statvfs(path).f_flag
    keep = sum(ms for st, ms in _KEEP_FLAGS.items() if flags & st)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | keep | (MS_RDONLY if readonly else 0))


def _setup_mounts(cfg: dict) -> bool:
    """Read-only world, private tmpfs scratch areas, writable dirs bound back. Runs as root of the new userns.
    Returns whether /proc now shows only our pid namespace."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount propagates back to the host
    # Hold every dir we must see again by fd: the tmpfs mounts below may hide it (e.g. a repo under /tmp).
    covered = lambda p: any(_under(p, d) for d in TMPFS_DIRS)  # noqa: E731 - paths the tmpfs will hide
    writable = list(cfg["writable_dirs"])
    if not covered(cfg["scratch"]):  # under /tmp the scratch dir is simply re-created in the private tmpfs
        writable.append(cfg["scratch"])
    # Read-only binds first, so a writable dir inside one of them is mounted on top, not hidden.
    ro = [p for p in cfg["ro_paths"] if covered(p) and not any(_under(p, w) for w in writable)]
    binds = [(os.open(p, os.O_PATH), p, False) for p in ro if os.path.exists(p)]
    binds += [(os.open(p, os.O_PATH | os.O_DIRECTORY), p, True) for p in writable]
    for mp in _mountpoints():
        try:
            _remount(mp, readonly=True)
        except OSError as e:
            # Mounts under an over-mounted path are unreachable (and hidden anyway); /proc and /sys have
            # sub-mounts that refuse remounts and stay protected by the kernel's own checks.
            unreachable = e.errno in (13, 2)  # EACCES, ENOENT
            if not (unreachable or _under(mp, "/proc") or _under(mp, "/sys")):
                raise
    for d in TMPFS_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_mb']}m,mode=1777")
    for fd, path, rw in binds:
        if not os.path.exists(path):  # its parent is now a fresh tmpfs: recreate the mount point
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _remount(path, readonly=not rw)
        os.close(fd)
    os.makedirs(cfg["scratch"], exist_ok=True)  # under /tmp the scratch dir lives in the private tmpfs
    try:  # a /proc that shows only our namespace; refused where the host masks parts of /proc (containers)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        return True
    except OSError:
        return False


def _apply_limits(cfg: dict) -> None:
    mb = 1024 * 1024
    for res, soft, hard in (
        (resource.RLIMIT_CPU, cfg["cpu_s"], cfg["cpu_s"] + 1),  # SIGXCPU at soft, SIGKILL at hard
        (resource.RLIMIT_AS, cfg["mem_mb"] * mb, cfg["mem_mb"] * mb),
        (resource.RLIMIT_NPROC, cfg["max_procs"], cfg["max_procs"]),
        (resource.RLIMIT_FSIZE, cfg["max_file_mb"] * mb, cfg["max_file_mb"] * mb),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        if soft is not None:
            resource.setrlimit(res, (int(soft), int(hard)))
    _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # setuid binaries (sudo, su) cannot raise privileges


def _exec_program(cfg: dict) -> None:
    """Never returns: becomes the program, or exits 127 if it cannot be started."""
    try:
        os.chdir(cfg["cwd"])
        _apply_limits(cfg)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores these; the program gets the usual defaults
        os.execvpe(cfg["argv"][0], cfg["argv"], cfg["env"])
    except BaseException as e:  # noqa: BLE001 - report anything and leave
        os.write(2, f"sandbox: cannot start {cfg['argv'][0]!r}: {e}\n".encode())
    os._exit(127)


def _exit_like(status: int) -> None:
    """Leave with a waitpid status: die of the same signal (so the caller sees -N) or exit with the code."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):  # the two that cannot (and need not) be reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _report(status_fd: int, msg: dict) -> None:
    os.write(status_fd, (json.dumps(msg) + "\n").encode())
    os.close(status_fd)


def _count_procs() -> int:
    return sum(1 for name in os.listdir("/proc") if name.isdigit())


def _init(cfg: dict, status_fd: int, exit_fd: int) -> None:
    """pid 1 of the sandbox: set up mounts, drop into a second userns, run and reap, pass on the exit status."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the caller killing our parent kills us (and all)
    try:
        own_proc = _setup_mounts(cfg)
        _unshare(CLONE_NEWUSER)
        _map_ids(SANDBOX_UID, 0, 0)  # outer ids are those of the first namespace, where we are root
    except Exception as e:  # noqa: BLE001
        _report(status_fd, {"error": f"{type(e).__name__}: {e}"})
        os._exit(125)
    _report(status_fd, {"isolation": "namespaces"})
    child = os.fork()
    if child == 0:
        _exec_program(cfg)  # exit_fd is close-on-exec: the program never sees it
    # The kernel ignores RLIMIT_NPROC for host root (kuid 0, even inside a user namespace), so we also count
    # the processes in our pid namespace ourselves; over the limit, we exit and the kernel kills them all.
    while True:
        pid, status = os.waitpid(-1, os.WNOHANG)  # reap orphans (they re-parent to us) and the program
        if pid == child:
            # pid 1 cannot die of a signal it sends itself, so the raw status goes to the outer process.
            os.write(exit_fd, f"{status}\n".encode())
            os._exit(0)
        if pid == 0:
            if own_proc and _count_procs() > cfg["max_procs"] + 1:
                os.write(exit_fd, b"process_limit\n")
                os._exit(0)
            time.sleep(0.005)


def main() -> None:
    cfg, status_fd = json.loads(sys.argv[1]), int(sys.argv[2])
    if not cfg["isolate"]:
        _report(status_fd, {"isolation": "none"})
        _exec_program(cfg)
    uid, gid = os.getuid(), os.getgid()
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | (0 if cfg["network"] else CLONE_NEWNET))
        _map_ids(0, uid, gid)
    except Exception as e:  # noqa: BLE001 - no user namespaces here (sysctl, AppArmor, seccomp)
        _report(status_fd, {"error": f"{type(e).__name__}: {e}"})
        os._exit(125)
    exit_r, exit_w = os.pipe()
    child = os.fork()  # the first child is pid 1 of the new pid namespace
    if child == 0:
        os.close(exit_r)
        _init(cfg, status_fd, exit_w)  # its own copy of the fd: closed there before the program starts
    os.close(exit_w)
    _, init_status = os.waitpid(child, 0)
    reported = os.read(exit_r, 64).strip()
    if reported == b"process_limit":
        os.write(status_fd, b'{"killed_reason": "process_limit"}\n')
        reported = str(signal.SIGKILL).encode()  # a raw wait status: killed by SIGKILL
    os.close(status_fd)
    _exit_like(int(reported) if reported else init_status)


if __name__ == "__main__":
    main()
