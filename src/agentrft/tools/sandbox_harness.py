"""The in-sandbox half of `agentrft.tools.sandbox`: a stdlib-only script run as `python -I -B harness.py FD CONFIG`.

It is copied next to the code for every call and runs before any of that code,
in this order:

1. read the payload (stdin) and the config (a JSON file written by the host);
2. `unshare` backend only: build the private root (bubblewrap does this itself)
   — a small read-only tmpfs holding read-only binds of /usr, the interpreter
   and its environment, the code directory at /sandbox, five device nodes, a
   fresh /proc of the new PID namespace and a size-capped tmpfs at /tmp
   (/dev/shm links into it, so shared memory counts against the same cap) —
   then chroot into it;
3. fork. The parent, PID 1 of the namespace with both backends, is the
   *relay*: it alone holds the result pipe FD and the host's lifeline, runs no
   code of the caller's, forwards what the code's process sends it, reaps
   orphans, and exits with the code's status — when the code's process ends,
   when the host dies (the lifeline reads end-of-file) or at the call's
   deadline, and its exit makes the kernel kill everything left in the
   namespace. The child goes on:
4. join the call's cgroups (memory and pids of the grade as a whole), where
   the host made them;
5. rlimits (CPU, address space, file size, processes, no core files);
6. privileges: as root, become the call's own uid (drawn by the host, so no
   other grade shares its process count); then enter a new user namespace
   whose limit on further user namespaces is 0 (so the code cannot mount a
   fresh, uncapped tmpfs of its own) and drop every capability, with
   no_new_privs;
7. report the isolation as observed from inside (PID, network interfaces,
   mounts, uid, capabilities), run the code, report the result: one JSON line
   per frame, sent on a socket to the relay. The kernel stamps each message
   with the sender's pid (SCM_CREDENTIALS); the relay forwards only what this
   process sent, and replaces anything another process sent (a fork, a
   subprocess the code started) with a `forged` frame.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import socket
import struct
import sys
import time
from typing import Any, NoReturn

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 1, 2, 4, 8, 32, 4096
MS_NOATIME, MS_NODIRATIME, MS_STRICTATIME = 1024, 2048, 1 << 24
ST_NOEXEC, ST_NOATIME, ST_NODIRATIME, ST_RELATIME = 8, 1024, 2048, 4096
CLONE_NEWUSER = 0x10000000
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 38, 47, 4
DEVICES = ("null", "zero", "full", "random", "urandom")

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """The sandbox could not be built; reported as a `setup` result, before any user code ran."""


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if s is None else s.encode() for s in (src, dst, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {src or fstype} on {dst}")


def _kept_flags(src: str) -> int:
    # Inside a user namespace a remount must keep the flags the host mount locked (noexec, atime mode).
    f = os.statvfs(src).f_flag
    flags = MS_NOEXEC if f & ST_NOEXEC else 0
    flags |= MS_NOATIME if f & ST_NOATIME else 0
    flags |= MS_NODIRATIME if f & ST_NODIRATIME else 0
    return flags | (0 if f & (ST_RELATIME | ST_NOATIME) else MS_STRICTATIME)


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def build_private_root(root: dict[str, Any]) -> None:
    """Mount the sandbox's file tree under root["dir"] and chroot into it (needs CAP_SYS_ADMIN in the mount ns)."""
    new = root["dir"]
    os.umask(0o022)
    _mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    # /tmp first: an interpreter or venv that lives under the host's /tmp is bound on top of it, not hidden
    os.makedirs(new + "/tmp", exist_ok=True)
    _mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={root['tmpfs_bytes']},mode=1777")
    os.mkdir(new + "/tmp/.shm")
    os.chmod(new + "/tmp/.shm", 0o1777)
    for src, dst in root["ro_binds"]:
        target = new + dst
        if os.path.isdir(src):
            os.makedirs(target, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(target), exist_ok=True)
            _write(target, "")
        _mount(src, target, None, MS_BIND)
        _mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | _kept_flags(src))
    os.makedirs(new + "/dev", exist_ok=True)
    for name in DEVICES:
        _write(f"{new}/dev/{name}", "")
        _mount(f"/dev/{name}", f"{new}/dev/{name}", None, MS_BIND)
    os.makedirs(new + "/proc", exist_ok=True)
    _mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for target, link in root["symlinks"]:  # last: an absolute link must not be followed while building
        os.symlink(target, new + link)
    _mount(None, new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(new)
    os.chroot(".")
    os.chdir("/tmp")
    _libc.sethostname(b"sandbox", 7)


def relay(child: int, chan: socket.socket, out_fd: int, lifeline: int, deadline_s: float) -> NoReturn:
    """Forward the code process's frames to the host; reap; exit with the code's status (128+N for signal N).

    Ends the call — and, as PID 1 of the namespace, everything in it — when the code's process ends, when the
    host is gone (`lifeline` at end-of-file: kill -9 of the caller runs no cleanup) or at `deadline_s`.
    """
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            os.close(fd)
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # its fds cannot be opened through /proc by the code's processes
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake poll() below
    poller = select.poll()
    for fd in (chan.fileno(), wake_r, lifeline):
        poller.register(fd, select.POLLIN)
    frames = _Frames(chan, child, out_fd)
    end = time.monotonic() + deadline_s
    while (status := _reap(child)) is None:
        left = end - time.monotonic()
        if left <= 0:
            _abandon()
        for fd, _event in poller.poll(left * 1000):
            if fd == lifeline:
                _abandon()
            elif fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            elif not frames.forward():
                poller.unregister(chan)  # every sender closed it: wait for the code's process to end
    chan.setblocking(False)  # what was sent before the code's process ended
    with contextlib.suppress(BlockingIOError):
        while frames.forward():
            pass
    os._exit(status)


class _Frames:
    """Passes on what the code's own process sends; anything another process sends becomes one `forged` frame."""

    def __init__(self, chan: socket.socket, child: int, out_fd: int) -> None:
        self.chan, self.child, self.out_fd, self.forged = chan, child, out_fd, False

    def forward(self) -> bool:
        """Pass on one message; False at end-of-file."""
        data, ancillary, _flags, _addr = self.chan.recvmsg(65536, socket.CMSG_SPACE(12))
        if not data:
            return False
        sender = next((struct.unpack("i", d[:4])[0] for _, t, d in ancillary if t == socket.SCM_CREDENTIALS), None)
        if sender == self.child:
            _write_all(self.out_fd, data)
        elif not self.forged:  # on a line of its own, whatever partial line came before
            self.forged = True
            _write_all(self.out_fd, b"\n" + json.dumps({"frame": "forged", "pid": sender}).encode() + b"\n")
        return True


def _write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:  # the host is gone
        _abandon()


def _reap(child: int) -> int | None:
    """Reap every exited child (orphans included, so zombies do not count against RLIMIT_NPROC)."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 1
        if pid == 0:
            return None
        if pid == child:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _abandon() -> NoReturn:
    """End the call now: as PID 1 by exiting (the kernel kills the namespace); with backend none, the group too."""
    with contextlib.suppress(OSError):
        os.killpg(0, signal.SIGKILL)  # PID 1 of a namespace ignores this from inside; others in its group do not
    os._exit(128 + signal.SIGKILL)


def set_limits(limits: dict[str, int | None]) -> dict[str, int]:
    applied = {}
    for key, value in limits.items():
        if value is None:
            continue
        hard = value + 1 if key == "RLIMIT_CPU" else value  # SIGXCPU at the soft limit, SIGKILL a second later
        resource.setrlimit(getattr(resource, key), (value, hard))
        applied[key] = value
    return applied


def drop_privileges(own_uid: int) -> str:
    """Become `own_uid` (the call's own) if root on the host; then a user namespace that cannot nest; then no
    capabilities. Returns what happened to nested user namespaces ("blocked", or why the host already refuses them).
    """
    if os.geteuid() == 0 and _uid_map() == "0 0 4294967295":
        os.setgroups([])
        os.setgid(own_uid)
        os.setuid(own_uid)
        _libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the uid change made /proc/self root's; the maps below need it
    uid, gid = os.geteuid(), os.getegid()
    if _libc.unshare(CLONE_NEWUSER) != 0:  # refused in a chroot (unshare backend): nesting is then blocked anyway
        nested = f"blocked (no new user namespace may be made here: {os.strerror(ctypes.get_errno())})"
    else:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
        try:
            _write("/proc/sys/user/max_user_namespaces", "0")
            nested = "blocked"
        except OSError as e:
            nested = f"allowed (could not lower user.max_user_namespaces: {e.strerror})"
    _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    for cap in range(last_cap + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # fails harmlessly where the bounding set is already empty
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    _check(_libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "capset")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    return nested


def _uid_map() -> str:
    try:
        with open("/proc/self/uid_map") as f:
            return " ".join(f.read().split())
    except OSError:
        return "unknown"


def _status(field: str) -> str:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split()[1]
    return "?"


def observed(cfg: dict[str, Any], rlimits: dict[str, int], nested: str | None) -> dict[str, Any]:
    """The isolation as seen from inside, so that what the host reports is checked, not assumed."""
    private = cfg["backend"] != "none"
    with open("/proc/net/dev") as f:
        interfaces = sorted(line.split(":")[0].strip() for line in f.readlines()[2:])
    user_ns = _uid_map() != "0 0 4294967295"
    uid = os.getuid()
    if cfg["host_uid"] == 0 and uid == cfg["uid"]:
        who = f"{uid} (this call's own uid)"
    elif user_ns:
        who = f"{uid} in a user namespace (host uid {cfg['host_uid']})"
    else:
        who = f"{uid} (host uid, no user namespace)"
    st = os.statvfs("/tmp")
    return {
        "backend": cfg["backend"],
        "pid": "namespace" if os.getpid() <= 2 else "shared",
        "network": "namespace" if private and interfaces == ["lo"] else "shared",
        "mounts": "private" if private else "host",
        "tmpfs_bytes": st.f_blocks * st.f_frsize if private else None,
        "user": "namespace" if user_ns else "host",
        "uid": who,
        "capabilities": "none" if int(_status("CapEff"), 16) == 0 == int(_status("CapPrm"), 16) else "kept",
        "nested_userns": nested or "allowed",
        "rlimits": rlimits,
    }


def _frame(out: Any, **frame: Any) -> None:
    out.write(json.dumps(frame) + "\n")
    out.flush()


def main() -> None:
    out_fd, cfg_path = int(sys.argv[1]), sys.argv[2]
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    payload = json.load(sys.stdin)
    try:
        if cfg["root"] is not None:
            build_private_root(cfg["root"])
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # before the fork: every message is stamped
        child = os.fork()
    except (SetupError, OSError) as e:
        _frame(os.fdopen(out_fd, "w"), frame="result", ok=False, kind="setup", error=str(e)[-2000:])
        return
    if child:
        for fd in (theirs.detach(), *cfg["cgroup_fds"]):
            os.close(fd)
        relay(child, ours, out_fd, cfg["lifeline_fd"], cfg["deadline_s"])
    ours.close()
    for fd in (out_fd, cfg["lifeline_fd"]):
        os.close(fd)
    out = os.fdopen(theirs.detach(), "w", encoding="utf-8")
    try:
        for fd in cfg["cgroup_fds"]:  # first: every process the code starts is then in them too
            os.write(fd, b"0")
            os.close(fd)
        rlimits = set_limits(cfg["limits"])
        nested = drop_privileges(cfg["uid"]) if cfg["backend"] != "none" else None
        iso = observed(cfg, rlimits, nested)
    except (SetupError, OSError) as e:
        _frame(out, frame="result", ok=False, kind="setup", error=str(e)[-2000:])
        return
    _frame(out, frame="isolation", **iso)
    run_code(out, cfg["code_path"], cfg["entrypoint"], payload)


def run_code(out: Any, code_path: str, entry: str, payload: dict[str, Any]) -> None:
    pid = os.getpid()
    try:
        with open(code_path, encoding="utf-8") as f:
            src = f.read()
        ns = {"__name__": "sandboxed", "__file__": code_path}
        exec(compile(src, code_path, "exec"), ns)
        fn = ns.get(entry)
        if not callable(fn):
            raise NameError(f"the code defines no function {entry!r}")
        value = fn(*payload.values())
        text = json.dumps({"frame": "result", "ok": True, "value": value})
    except BaseException as e:
        if os.getpid() != pid:
            os._exit(1)  # a forked child never reports
        import traceback

        msg = "".join(traceback.format_exception_only(type(e), e)).strip()
        _frame(out, frame="result", ok=False, kind="exception", error=msg[-2000:])
        return
    if os.getpid() != pid:
        os._exit(0)
    out.write(text + "\n")
    out.flush()


if __name__ == "__main__":
    main()
