"""How a sandboxed call is launched: the file tree it sees and the command line of each backend.

Backends (`sandbox=` in `run_sandboxed`, `sandbox:` in a python grader spec):

- `bwrap` (bubblewrap, Debian/Ubuntu package `bubblewrap`): preferred. As root it
  runs without a user namespace and keeps only CAP_SETUID/CAP_SETGID so the
  harness can become nobody; as any other user it makes a user namespace
  (`--unshare-user --disable-userns`), which needs unprivileged user
  namespaces (most distributions allow them; some containers do not).
- `unshare` (util-linux): the same namespaces, with the mounts done by the
  harness itself (`sandbox_harness.build_private_root`); as a non-root user it
  adds `--user --map-root-user`.
- `none`: no namespaces at all, only rlimits and a process-group kill. Never
  chosen automatically: the caller must ask for it.

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
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from dataclasses import dataclass

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
    args = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "sandbox", "--die-with-parent"]
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
        for parent in _parents(dst):  # bwrap would make them 0700, unreadable once the harness is nobody
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
