"""Prometheus text pages of a llama-server router's models merged into one page.

Pure. A router has one page per loaded model (``/metrics?model=NAME``); the merged page
holds each family once, every sample labelled with its ``model``.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["per_model_page"]


def per_model_page(pages: Sequence[tuple[str, bytes]]) -> bytes:
    """The exposition pages of several models (a router's ``/metrics?model=NAME``) as one
    page: each family once, its ``# HELP`` and ``# TYPE`` from the first page that has them,
    then every model's samples with a ``model`` label added."""
    families: dict[bytes, tuple[list[bytes], list[bytes]]] = {}
    for model, page in pages:
        label = b'model="' + _label_value(model) + b'"'
        current = b""
        for line in page.splitlines():
            parts = line.split(None, 3)
            if not parts:
                continue
            if parts[0] == b"#":
                if len(parts) >= 3 and parts[1] in (b"HELP", b"TYPE"):
                    current = parts[2]
                    header = families.setdefault(current, ([], []))[0]
                    if not any(h.split(None, 2)[1] == parts[1] for h in header):
                        header.append(line)
                continue  # other comments are the page's own, not the samples'
            families.setdefault(current, ([], []))[1].append(_labelled(line, label))
    out = [line for header, samples in families.values() for line in (*header, *samples)]
    return b"\n".join(out) + b"\n" if out else b""


def _label_value(value: str) -> bytes:
    """``value`` escaped as the exposition format's label values are."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return escaped.encode()


def _labelled(sample: bytes, label: bytes) -> bytes:
    """One sample line with ``label`` (``name="value"``) first among its labels."""
    end = len(sample)
    for mark in (b"{", b" ", b"\t"):
        at = sample.find(mark)
        if at != -1:
            end = min(end, at)
    name, rest = sample[:end], sample[end:]
    if rest.startswith(b"{}"):
        return name + b"{" + label + b"}" + rest[2:]
    if rest.startswith(b"{"):
        return name + b"{" + label + b"," + rest[1:]
    return name + b"{" + label + b"}" + rest
