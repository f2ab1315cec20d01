"""The clients of the corpus as agents drive them: a tool loop of the OpenAI SDK (Chat
Completions, streamed or not), one of the Anthropic SDK (Messages), one of LangChain, and a
run of the OpenAI Agents SDK. Each call goes to the base URL it is given (a capturing relay
of ``tests/corpus/record.py``); what the agent appends between calls is what the client
library makes of the model's real answer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.corpus.common import CHAT_ARGS, MODEL, NO_THINKING, STOP, TOOL_ARGS, run_tool

__all__ = ["AnthropicAgent", "LangChainAgent", "OpenAIAgent", "agents_sdk_run"]


def _openai(base: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


@dataclass
class OpenAIAgent:
    """A tool agent on the OpenAI SDK's ``chat.completions``: after each answer it appends
    the model's message (the SDK's object, as agents do) and the tools' results, or, when
    the model called no tool, its next question."""

    base: str
    messages: list[Any]
    tools: list[dict[str, Any]] | None
    follow_ups: list[str] = field(default_factory=list)
    stream: bool = False
    system_at: Callable[[int], str] | None = None
    """A system prompt made anew for each call (a clock)."""
    tools_at: Callable[[int], list[dict[str, Any]]] | None = None
    """The tools of each call (a list the agent orders anew)."""
    extra: dict[str, Any] = field(default_factory=dict)
    calls: int = 0

    def ask(self) -> Any:
        """Send the next request; append its answer for the one after."""
        client = _openai(self.base)
        if self.system_at is not None:
            self.messages[0] = {"role": "system", "content": self.system_at(self.calls)}
        tools = self.tools_at(self.calls) if self.tools_at is not None else self.tools
        args = dict(TOOL_ARGS if tools else CHAT_ARGS)
        args.update(self.extra)
        if tools:
            args["tools"] = tools
        else:
            args.pop("parallel_tool_calls", None)
        self.calls += 1
        if self.stream:
            from openai import LengthFinishReasonError

            with client.chat.completions.stream(
                model=MODEL, messages=self.messages, **args
            ) as stream:
                try:
                    completion = stream.get_final_completion()
                except LengthFinishReasonError as cut:  # the answer as far as it went
                    completion = cut.completion
            message = completion.choices[0].message
        else:
            response = client.chat.completions.create(model=MODEL, messages=self.messages, **args)
            message = response.choices[0].message
        self.messages.append(message)
        calls = message.tool_calls or []
        for call in calls:
            result = run_tool(call.function.name, call.function.arguments)
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not calls and self.follow_ups:
            self.messages.append({"role": "user", "content": self.follow_ups.pop(0)})
        return message


@dataclass
class AnthropicAgent:
    """A tool agent on the Anthropic SDK's ``messages.create`` (``/v1/messages``): the
    answer's content blocks appended as the assistant turn, then a user turn of
    ``tool_result`` blocks, or its next question."""

    base: str
    system: str | None
    tools: list[dict[str, Any]]
    messages: list[Any]
    follow_ups: list[str] = field(default_factory=list)

    def ask(self) -> Any:
        """Send the next request; append its answer for the one after."""
        from anthropic import Anthropic

        client = Anthropic(base_url=self.base, api_key="unused", max_retries=0)
        anthropic_tools: list[Any] = [
            {
                "name": t["function"]["name"],
                "description": t["function"]["description"],
                "input_schema": t["function"]["parameters"],
            }
            for t in self.tools
        ]
        system: dict[str, Any] = {"system": self.system} if self.system else {}
        response = client.messages.create(
            model=MODEL,
            max_tokens=40,
            **system,
            tools=anthropic_tools,
            messages=self.messages,
            stop_sequences=STOP,
            # this SDK's create() no longer takes a temperature: in the body, as the API has it
            extra_body={"temperature": 0, "chat_template_kwargs": NO_THINKING},
        )
        # the SDK's block objects, as its documentation's tool loop appends them
        self.messages.append({"role": "assistant", "content": response.content})
        results = [
            {
                "type": "tool_result",
                "tool_use_id": block.id,
                "content": run_tool(block.name, block.input),
            }
            for block in response.content
            if block.type == "tool_use"
        ]
        if results:
            self.messages.append({"role": "user", "content": results})
        elif self.follow_ups:
            self.messages.append({"role": "user", "content": self.follow_ups.pop(0)})
        return response


@dataclass
class LangChainAgent:
    """A tool agent on LangChain: ``ChatOpenAI(...).bind_tools(...)`` invoked on the
    history, the ``AIMessage`` appended, a ``ToolMessage`` per call, or its next question.
    ``trim`` (a ``langchain_core.messages.trim_messages`` call) compacts the history
    before each call."""

    base: str
    messages: list[Any]
    tools: list[dict[str, Any]] | None = None
    follow_ups: list[str] = field(default_factory=list)
    streaming: bool = False
    trim: Callable[[list[Any]], list[Any]] | None = None

    def ask(self) -> Any:
        """Send the next request; append its answer for the one after."""
        from langchain_core.messages import HumanMessage, ToolMessage
        from langchain_openai import ChatOpenAI

        args = dict(TOOL_ARGS if self.tools else CHAT_ARGS)
        args.pop("parallel_tool_calls", None)
        model: Any = ChatOpenAI(
            model=MODEL,
            base_url=self.base + "/v1",
            api_key="unused",  # type: ignore[arg-type]
            max_retries=0,
            streaming=self.streaming,
            **args,
        )
        if self.tools:
            model = model.bind_tools(self.tools, parallel_tool_calls=False)
        if self.trim is not None:
            self.messages[:] = self.trim(self.messages)
        answer = model.invoke(self.messages)
        self.messages.append(answer)
        for call in answer.tool_calls:
            result = run_tool(call["name"], call["args"])
            self.messages.append(ToolMessage(content=result, tool_call_id=call["id"]))
        if not answer.tool_calls and self.follow_ups:
            self.messages.append(HumanMessage(self.follow_ups.pop(0)))
        return answer


def agents_sdk_run(base: str, responses: bool, prompt: str, turns: int) -> int:
    """One ``Runner.run`` of an OpenAI Agents SDK agent with one function tool and no
    instructions, on its Responses model or its Chat Completions model; at most ``turns``
    model calls (the model may call the tool on every turn). The number of calls made."""
    import agents
    from agents import (
        Agent,
        MaxTurnsExceeded,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
    )
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)

    calls = 0

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city.

        Args:
            city: The city.
        """
        nonlocal calls
        calls += 1
        return run_tool("get_weather", {"city": city})

    async def run() -> None:
        client = AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
        model: Any = (
            OpenAIResponsesModel(model=MODEL, openai_client=client)
            if responses
            else OpenAIChatCompletionsModel(model=MODEL, openai_client=client)
        )
        agent: Agent[Any] = Agent(
            name="weather robot",
            tools=[get_weather],
            model=model,
            model_settings=ModelSettings(
                temperature=0,
                parallel_tool_calls=False,
                max_tokens=40,
                extra_body={"chat_template_kwargs": NO_THINKING, "stop": STOP},
            ),
        )
        try:
            await Runner.run(agent, prompt, max_turns=turns)
        except MaxTurnsExceeded:
            pass
        finally:
            await client.close()

    asyncio.run(run())
    return calls
