"""The commands' failures a user can cause and fix, which the command line reports in one line
(:mod:`proxy.commands.cli`).

They live here, apart from the code that raises them, so that the command line knows every one
of them without importing every command: ``serve`` never loads ``report``, ``bench``,
``demo``, ``explain`` or the provisioning.
"""

from __future__ import annotations

__all__ = ["DemoError", "ExplainError", "LlamaServerError", "ProvisionError", "ReportError"]


class ReportError(Exception):
    """The report cannot be made (unreadable file, bad argument); the message says why."""


class ExplainError(RuntimeError):
    """The experiment cannot run (the message is one line and says what to do)."""


class DemoError(RuntimeError):
    """The demo's proxy did not come up (the message is one line)."""


class ProvisionError(RuntimeError):
    """An artefact could not be downloaded, built or verified.

    The first line of the message says what failed and where its log is; details (a log's
    tail) follow on later lines.
    """


class LlamaServerError(RuntimeError):
    """llama-server did not become ready.

    The first line of the message says why and names the server's log; the log's tail
    follows on later lines.
    """
