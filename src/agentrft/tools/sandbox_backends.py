"""How a sandboxed call is launched: the file tree it sees and the command line of each backend.

Backends (`sandbox=` in `run_sandboxed`, `sandbox:` in a python grader spec):

- `bwrap` (bubblewrap, Debian/Ubuntu package `bubblewrap`): preferred. As root it
  runs without a user namespace and keeps only CAP_SETUID/CAP_SETGID so the
  harness can become the call's own uid; as any other user it makes a user namespace
  (`--unshare-user --disable-userns`), which needs unprivileged user
  namespaces (most distributions allow them; some containers do not).
- `unshare` (util-linux): the same namespaces, with the mounts done by the
  harness itself (`sandbox_harness.build_private_root`); as a non-root user it
  adds `--user --map-root-user`.
- `none`: no namespaces at all, only rlimits, the call's cgroups (where there
  are any) and a process-group kill. Never chosen automatically: the caller
  must ask for it.

`auto` takes the first of bwrap, unshare that works here, checked once per
process by running a trivial call through it (`backend_problem`).

The file tree, the same for both: a read-only root holding read-only binds of
/usr (and the /bin, /lib… links or directories beside it), the interpreter's
installation and environment (`sys.base_prefix`, `sys.prefix`: the stdlib and
site-packages), the per-call code directory at /sandbox; null, zero, full,
random, urandom in /dev; a fresh /proc of the new PID namespace; a tmpfs of
`disk_bytes` at /tmp (also cwd, HOME and TMPDIR) with /dev/shm a link into it,
so files and shared memory share one cap. Nothing else of the host exists
inside: no project tree, no host /proc, no UNIX sockets.

Around each call, on the host:

- its directory (`CallDir`: the code, the config, the payload) in the temp
  dir, locked (flock) by the calling process while the call runs. A process
  killed mid-call (kill -9 runs no cleanup) leaves it unlocked, and the next
  process to make a call removes it (`sweep_stale_calls`), cgroups included.
- its cgroups (`CallCgroup`), where this machine lets us make them
  (`cgroup_roots`: cgroup v2 whose own cgroup delegates the memory and pids
  controllers, else the cgroup v1 memory and pids hierarchies, both writable
  — as root, typically): `memory.max`/`memory.limit_in_bytes` (swap too
  where it is accounted) and `pids.max` for the grade as a whole.
- its own uid (`call_uid`, used only when running as root): RLIMIT_NPROC and
  the kernel's per-user quotas then count this grade's processes alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import itertools
import json
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BACKENDS = ("bwrap", "unshare", "none")
SANDBOX_DIR = "/sandbox"  # where the code directory appears inside
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"}
_INSTALL_HINT = "install bubblewrap (apt-get install bubblewrap)"


class SandboxUnavailable(RuntimeError):
    """No requested isolation works on this machine; the message says why and how to opt out."""


@dataclass(frozen=True)
class FileTree:
    ro_binds: list[tuple[str, str]]  # (host path, path inside)
    symlinks: list[tuple[str, str]]  # (target, link path inside)
    tmpfs_bytes: int

    def as_config(self, new_root: str) -> dict[str, object]:
        """What `sandbox_harness.build_private_root` needs (unshare backend)."""
        return {"dir": new_root, "ro_binds": self.ro_binds, "symlinks": self.symlinks, "tmpfs_bytes": self.tmpfs_bytes}


@functools.lru_cache(maxsize=1)
def _system_tree() -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    binds: list[str] = ["/usr"]
    links: list[tuple[str, str]] = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = "/" + name
        if os.path.islink(path):
            links.append((os.readlink(path), path))
        elif os.path.isdir(path):
            binds.append(path)
    python = [sys.base_prefix, sys.base_exec_prefix, sys.prefix, sys.exec_prefix]
    python.append(os.path.dirname(os.path.realpath(sys.executable)))
    for path in sorted({os.path.abspath(p) for p in python}, key=len):
        if os.path.isdir(path) and not any(path == b or path.startswith(b.rstrip("/") + "/") for b in binds):
            binds.append(path)
    return tuple((b, b) for b in binds), tuple(links)


def file_tree(code_dir: str, tmpfs_bytes: int) -> FileTree:
    binds, links = _system_tree()
    links_inside = [*links, ("/tmp/.shm", "/dev/shm"), ("/proc/self/fd", "/dev/fd")]
    links_inside += [(f"/proc/self/fd/{i}", f"/dev/{n}") for i, n in enumerate(("stdin", "stdout", "stderr"))]
    return FileTree([*binds, (code_dir, SANDBOX_DIR)], links_inside, tmpfs_bytes)


def _parents(path: str) -> list[str]:
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def bwrap_args(tree: FileTree, network: bool) -> list[str]:
    """bubblewrap options (passed through `--args FD`, so the sandbox's /proc/1/cmdline does not list host paths)."""
    # --as-pid-1: the harness's relay is PID 1, as with unshare, so its exit ends the namespace
    args = ["--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox"]
    args.append("--die-with-parent")
    if not network:
        args.append("--unshare-net")
    if os.geteuid() == 0:
        args += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        args += ["--unshare-user", "--disable-userns"]
    # /tmp first: an interpreter or venv that lives under the host's /tmp is bound on top of it, not hidden
    args += ["--size", str(tree.tmpfs_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
    args += ["--perms", "1777", "--dir", "/tmp/.shm"]
    made: set[str] = {"/tmp"}
    for src, dst in tree.ro_binds:
        for parent in _parents(dst):  # bwrap would make them 0700, unreadable once the harness drops root
            if parent not in made:
                made.add(parent)
                args += ["--perms", "0755", "--dir", parent]
        args += ["--ro-bind", src, dst]
    args += ["--perms", "0755", "--dir", "/dev"]
    for name in ("null", "zero", "full", "random", "urandom"):
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    args += ["--proc", "/proc"]
    for target, link in tree.symlinks:
        args += ["--symlink", target, link]
    return [*args, "--remount-ro", "/", "--chdir", "/tmp"]


def unshare_argv(network: bool) -> list[str]:
    argv = ["unshare", "--pid", "--kill-child", "--mount", "--propagation", "private", "--ipc", "--uts"]
    if not network:
        argv.append("--net")
    if os.geteuid() != 0:
        argv += ["--user", "--map-root-user"]
    return [*argv, "--"]


def which(name: str) -> str | None:
    return shutil.which(name, path="/usr/bin:/bin:/usr/sbin:/sbin:/usr/local/bin")


def unavailable_message(name: str, reasons: dict[str, str]) -> str:
    why = "; ".join(f"{b}: {r}" for b, r in reasons.items())
    what = "no sandbox for untrusted code works on this machine" if name == "auto" else f"sandbox {name!r} cannot run"
    return (
        f"{what} ({why}). Fix: {_INSTALL_HINT}, or allow user namespaces for non-root users; or opt out explicitly "
        'with sandbox="none" (a grader spec\'s "sandbox": "none"), which runs the code with rlimits only and can '
        "reach the host's files, processes and sockets."
    )


# Root runs each call as a uid of its own from this range (never a host account's: they are far below it). A random
# start per process, then consecutive: no two calls of one process share one, calls of two processes rarely do.
SANDBOX_UIDS = range(0x50000000, 0x51000000)
_uid_counter = itertools.count(secrets.randbelow(len(SANDBOX_UIDS)))


def call_uid() -> int:
    return SANDBOX_UIDS[next(_uid_counter) % len(SANDBOX_UIDS)]


CALL_PREFIX = "agentrft-sbx-"
_MARKER = "cgroups.json"  # written once the directory is locked: its presence tells a crashed call from a new one
_NEW_CALL_GRACE_S = 3600.0  # an unlocked directory without the marker is someone's call being set up, until then


class CallDir:
    """One call's directory in the temp dir, held locked by the calling process until `close`."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix=CALL_PREFIX))
        self._fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self._record([])

    def make_cgroup(self, roots: CgroupRoots, memory_bytes: int, max_procs: int) -> CallCgroup:
        dirs = [os.path.join(parent, self.path.name) for parent in roots.parents]
        self._record(dirs)  # first: a crash between the two still leaves them findable
        return CallCgroup.make(roots.version, dirs, memory_bytes, max_procs)

    def close(self, cgroup: CallCgroup | None) -> None:
        """Remove the cgroup and the directory; the directory stays (for a later sweep) if the cgroup would not go."""
        if cgroup is None or cgroup.remove():
            shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._fd)

    def _record(self, cgroups: list[str]) -> None:
        tmp = self.path / (_MARKER + ".new")
        tmp.write_text(json.dumps(cgroups))
        tmp.replace(self.path / _MARKER)


def sweep_stale_calls(tmp_dir: str) -> list[str]:
    """Remove the call directories (and cgroups) of processes that died mid-call; returns the ones removed."""
    removed, candidates = [], []
    with contextlib.suppress(OSError), os.scandir(tmp_dir) as entries:
        candidates = [e for e in entries if e.name.startswith(CALL_PREFIX)]
    for entry in candidates:
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:  # gone meanwhile, not a directory, or another user's
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its process is alive
                continue
            try:
                cgroups = json.loads(Path(entry.path, _MARKER).read_text())
            except FileNotFoundError:
                if time.time() - st.st_mtime < _NEW_CALL_GRACE_S:
                    continue
                cgroups = []
            except (OSError, ValueError):
                cgroups = []
            ours = [c for c in cgroups if isinstance(c, str) and os.path.basename(c) == entry.name]
            if remove_cgroups(ours):
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry.path)
        finally:
            os.close(fd)
    return removed


@dataclass(frozen=True)
class CgroupRoots:
    """Where this process may make a call's cgroups: ("v2", (dir,)) or ("v1", (memory dir, pids dir))."""

    version: str
    parents: tuple[str, ...]


@dataclass(frozen=True)
class CallCgroup:
    """A call's cgroup(s): memory and tasks of the whole grade are capped, and whatever is left can be killed."""

    version: str
    dirs: list[str]

    @classmethod
    def make(cls, version: str, dirs: list[str], memory_bytes: int, max_procs: int) -> CallCgroup:
        memory, pids = (dirs[0], dirs[0]) if version == "v2" else dirs
        # (dir, file, value, needed): swap is capped only where the kernel accounts it (the file exists); v1's
        # memsw (memory + swap) may not be set below the memory limit, so after it
        if version == "v2":
            memory_files = [(memory, "memory.max", memory_bytes, True), (memory, "memory.swap.max", 0, False)]
        else:
            memory_files = [
                (memory, "memory.limit_in_bytes", memory_bytes, True),
                (memory, "memory.memsw.limit_in_bytes", memory_bytes, False),
            ]
        cg = cls(version, dirs)
        try:
            for d in dirs:
                os.mkdir(d)
            for d, name, value, needed in [*memory_files, (pids, "pids.max", max_procs, True)]:
                if needed or os.path.exists(os.path.join(d, name)):
                    Path(d, name).write_text(str(value))
        except OSError:
            cg.remove()
            raise
        return cg

    def procs_paths(self) -> list[str]:
        """The files a process writes "0" to in order to join (the harness does, before any code runs)."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def oom_kills(self) -> int:
        """Processes the kernel killed for going over the memory cap."""
        name = "memory.events" if self.version == "v2" else "memory.oom_control"
        with contextlib.suppress(OSError, ValueError):
            for line in Path(self.dirs[0], name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> bool:
        """Kill what is left in it, then remove it; False if it would not go (it is then left for a later sweep)."""
        return remove_cgroups(self.dirs)


def remove_cgroups(dirs: list[str]) -> bool:
    for d in dirs:
        deadline = time.monotonic() + 10.0  # the namespace is already dying: this is only a backstop
        while os.path.isdir(d):
            with contextlib.suppress(OSError):
                os.rmdir(d)
                continue
            if time.monotonic() > deadline:
                return False
            with contextlib.suppress(OSError):
                for pid in Path(d, "cgroup.procs").read_text().split():
                    with contextlib.suppress(OSError):
                        os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.01)
    return True


@functools.cache
def cgroup_roots() -> CgroupRoots | None:
    """Where this process can make per-call cgroups (checked once, by making one), or None: then rlimits only."""
    mine = _own_cgroups()
    candidates = []
    v2 = mine.get("v2")
    with contextlib.suppress(OSError):
        if v2 and {"memory", "pids"} <= set(Path(v2, "cgroup.subtree_control").read_text().split()):
            candidates.append(CgroupRoots("v2", (v2,)))
    if "memory" in mine and "pids" in mine:
        candidates.append(CgroupRoots("v1", (mine["memory"], mine["pids"])))
    for roots in candidates:
        trial = CallDir()
        cgroup = None
        try:
            cgroup = trial.make_cgroup(roots, 64 * 1024**2, 8)
            return roots
        except OSError:
            continue
        finally:
            trial.close(cgroup)
    return None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup directories that it may write to: {"v2": dir, "memory": dir, "pids": dir}, if mounted."""
    paths: dict[str, str] = {}  # hierarchy -> this process's cgroup in it
    mounts: list[tuple[str, str, str]] = []  # (hierarchy, root of the mount in it, mount point)
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _id, controllers, path = line.rstrip("\n").split(":", 2)
                for key in controllers.split(",") if controllers else ["v2"]:
                    paths[key] = path
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, right = line.split(" - ", 1)
                fields, (fstype, _source, options) = left.split(), right.split()[:3]
                keys = ["v2"] if fstype == "cgroup2" else options.split(",") if fstype == "cgroup" else []
                mounts += [(key, fields[3], fields[4]) for key in keys if key in ("v2", "memory", "pids")]
    except (OSError, ValueError):
        return {}
    found = {}
    for key, root, mountpoint in mounts:
        own = paths.get(key)
        if own is not None:
            inside = own[len(root) :] if root != "/" and own.startswith(root) else own
            d = os.path.join(mountpoint, inside.lstrip("/"))
            if os.path.isdir(d) and os.access(d, os.W_OK):
                found[key] = d
    return found
