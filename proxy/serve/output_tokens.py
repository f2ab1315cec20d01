"""The tokens of what the model wrote that the server's counts do not split out: the tool
calls' arguments and the reasoning, counted by the served tokenizer after the answer.

These look-ups ask a router not to load the model (``loaded_only``): a model unloaded since
the answer would otherwise be loaded back in place of the one the agent uses now. An
upstream without ``/tokenize`` gives the arguments tiktoken's estimate (marked
``estimate``) and the reasoning ``null``.
"""

from __future__ import annotations

import asyncio

from proxy.core.partials import OutputTokens
from proxy.core.tracker import MAX_ARGUMENT_BYTES, Observation
from proxy.serve.lookups import Lookups, Unsupported, estimate_tokens, failure_reason

__all__ = ["OutputCounter"]


class OutputCounter:
    """Counts the arguments and the reasoning of one answer."""

    def __init__(self, lookups: Lookups) -> None:
        self._lookups = lookups

    async def count(self, obs: Observation, model: str | None) -> tuple[OutputTokens, list[str]]:
        """The answer's argument and reasoning tokens, and why some are ``null`` (each
        reason prefixed by what it is about: ``tool_args:``, ``reasoning:``)."""
        errors: list[str] = []
        args: tuple[int, str] | None = None
        if obs.tool_calls and obs.arguments_dropped:
            errors.append(f"tool_args: over {MAX_ARGUMENT_BYTES // 1024} KiB, not counted")
        elif obs.tool_calls:
            try:
                args = await asyncio.wait_for(
                    self._args_tokens(obs, model), self._lookups.timeout_s
                )
            except Exception as exc:
                errors.append(f"tool_args: {failure_reason(exc)}")
        reasoning: int | None = None
        if obs.reasoning_text:
            reasoning, error = await self._reasoning_tokens(obs.reasoning_text, model)
            if error is not None:
                errors.append(error)
        return OutputTokens(
            tool_args_tokens=None if args is None else args[0],
            tool_args_tokens_source=None if args is None else args[1],
            reasoning_tokens=reasoning,
        ), errors

    async def _args_tokens(self, obs: Observation, model: str | None) -> tuple[int, str]:
        texts = [c.arguments for c in obs.tool_calls]
        tokens = self._lookups.tokens
        try:
            counts = await asyncio.gather(
                *(tokens(t, False, model, loaded_only=True) for t in texts)
            )
            return sum(counts), "server"
        except Unsupported:
            counts = [await asyncio.to_thread(estimate_tokens, t) for t in texts]
            return sum(counts), "estimate"

    async def _reasoning_tokens(
        self, text: str, model: str | None
    ) -> tuple[int | None, str | None]:
        """The reasoning's tokens as the served tokenizer counts them (``/tokenize``), or
        None and why: no estimate here, an upstream without ``/tokenize`` gives null."""
        try:
            tokens = self._lookups.tokens(text, False, model, loaded_only=True)
            return await asyncio.wait_for(tokens, self._lookups.timeout_s), None
        except Unsupported:
            return None, None
        except Exception as exc:
            return None, f"reasoning: {failure_reason(exc)}"
