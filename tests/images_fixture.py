"""What the image tests generate themselves: a Gemma 3 projector file and PNG images.

The projector (``--mmproj``) is written with the ``gguf`` package from random weights: the
keys and tensor names llama.cpp's clip loader reads for projector type ``gemma3``
(``tools/mtmd/clip.cpp``, ``clip-impl.h``), a tiny vision tower (image 896, patch 14, so
64 x 64 patches, average-pooled by 4 into 16 x 16 = 256 tokens per image; embedding 64, two
layers) projected to 640 = Gemma 3 270M's ``n_embd``. About 1.5 MB, no download. The text it
makes the model write is noise; the prompt it makes is real, which is all accounting needs.

PNGs are written with ``zlib`` and ``struct`` alone (no Pillow): one solid colour each.
"""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = [
    "IMAGE_SIZE",
    "PATCH_SIZE",
    "PROJECTION_DIM",
    "TOKENS_PER_IMAGE",
    "data_url",
    "solid_png",
    "write_gemma3_projector",
]

IMAGE_SIZE = 896
PATCH_SIZE = 14
MERGE = 4
EMBEDDING = 64
FEED_FORWARD = 128
LAYERS = 2
HEADS = 4
PROJECTION_DIM = 640
"""Gemma 3 270M's embedding length: the projector's output must match the text model's."""
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH_SIZE // MERGE) ** 2
"""256: the image chunk's tokens (the prompt also gets ``<start_of_image>``/``<end_of_image>``)."""


def _tensors(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """The tensors, in numpy's axis order (the reverse of ggml's ``ne``)."""

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    out = {
        "v.patch_embd.weight": w(EMBEDDING, 3, PATCH_SIZE, PATCH_SIZE),
        "v.patch_embd.bias": zeros(EMBEDDING),
        "v.position_embd.weight": w(patches, EMBEDDING),
        "v.post_ln.weight": ones(EMBEDDING),
        "v.post_ln.bias": zeros(EMBEDDING),
        "mm.input_projection.weight": w(EMBEDDING, PROJECTION_DIM),
        "mm.soft_emb_norm.weight": ones(EMBEDDING),
    }
    for i in range(LAYERS):
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            out[f"v.blk.{i}.{name}.weight"] = w(EMBEDDING, EMBEDDING)
            out[f"v.blk.{i}.{name}.bias"] = zeros(EMBEDDING)
        for name in ("ln1", "ln2"):
            out[f"v.blk.{i}.{name}.weight"] = ones(EMBEDDING)
            out[f"v.blk.{i}.{name}.bias"] = zeros(EMBEDDING)
        out[f"v.blk.{i}.ffn_up.weight"] = w(FEED_FORWARD, EMBEDDING)
        out[f"v.blk.{i}.ffn_up.bias"] = zeros(FEED_FORWARD)
        out[f"v.blk.{i}.ffn_down.weight"] = w(EMBEDDING, FEED_FORWARD)
        out[f"v.blk.{i}.ffn_down.bias"] = zeros(EMBEDDING)
    return out


def write_gemma3_projector(path: Path, seed: int = 0) -> Path:
    """Write a Gemma 3 projector file with random weights to ``path``; return ``path``."""
    import gguf  # the test extra's; imported here so the fast tests never need it

    writer = gguf.GGUFWriter(str(path), arch="clip")
    writer.add_string("general.name", "timing-proxy test projector")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    writer.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    writer.add_uint32("clip.vision.embedding_length", EMBEDDING)
    writer.add_uint32("clip.vision.feed_forward_length", FEED_FORWARD)
    writer.add_uint32("clip.vision.block_count", LAYERS)
    writer.add_uint32("clip.vision.projection_dim", PROJECTION_DIM)
    writer.add_uint32("clip.vision.attention.head_count", HEADS)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_uint32("clip.vision.projector.scale_factor", MERGE)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    writer.add_bool("clip.use_gelu", True)
    for name, tensor in _tensors(np.random.default_rng(seed)).items():
        writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    )


def solid_png(rgb: tuple[int, int, int], width: int = 224, height: int = 224) -> bytes:
    """A ``width`` x ``height`` PNG of one colour (8-bit RGB, no filter)."""
    row = b"\x00" + bytes(rgb) * width
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(row * height))
        + _chunk(b"IEND", b"")
    )


def data_url(png: bytes) -> str:
    """``png`` as a ``data:image/png;base64,…`` URL."""
    return "data:image/png;base64," + base64.b64encode(png).decode()
