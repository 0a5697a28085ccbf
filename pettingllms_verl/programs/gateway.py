"""The gateway: an OpenAI-compatible HTTP door into the rollout for team programs.

One aiohttp server per rollout process, on the loopback interface by default, serves every
program run of that process. Each run gets its own base URL, ``http://<host>:<port>/<token>/v1``,
whose token is unguessable (``secrets``) and forgotten when the run ends: a call with an unknown,
finished or another run's token is answered 404 and recorded nowhere, so one episode can never
write into another's rows.

Routes (under the base URL): ``GET /models`` lists the run's agents; ``POST /chat/completions``
takes a chat request whose ``model`` names an agent. This module only speaks HTTP and checks
requests (``parse_request``: every value the program sends is untrusted); what a call does (render,
sample, record) is the run's handler (``programs/episode.py``).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from pettingllms_verl.config import GREEDY_BELOW

MESSAGE_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOP = 4  # stop sequences per request, as OpenAI's API allows


class GatewayError(Exception):
    """An answer other than a completion: HTTP ``status`` with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "code": self.status}}


@dataclass
class ChatRequest:
    """A checked ``/chat/completions`` request: the agent, messages as the chat template takes them,
    the tool schemas (OpenAI function tools), and the sampling values the program set."""

    agent: str
    messages: list[dict]
    tools: list[dict] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)  # temperature, top_p, max_tokens, stop


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: text only
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise GatewayError(400, f"{where}: only text content parts are supported ({{'type': 'text', 'text': ...}})")
            parts.append(part["text"])
        return "".join(parts)
    raise GatewayError(400, f"{where}: content must be a string, a list of text parts or null")


def _tool_calls(calls: Any, where: str) -> list[dict]:
    """An assistant message's ``tool_calls`` as chat templates read them (arguments as a dict)."""
    if not isinstance(calls, list):
        raise GatewayError(400, f"{where}.tool_calls: must be a list")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise GatewayError(400, f"{where}.tool_calls[{i}]: needs function.name")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):  # not JSON, or JSON Python will not read (a 5,000-digit number, deep nesting)
                pass  # kept as the text the model wrote: the template renders it as it came
        out.append({"id": str(call.get("id", "")), "type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return out


def _messages(raw: Any) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise GatewayError(400, "messages: must be a non-empty list")
    out = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or message["role"] not in MESSAGE_ROLES:
            raise GatewayError(400, f"{where}.role: must be one of {sorted(MESSAGE_ROLES)}")
        clean = {"role": MESSAGE_ROLES[message["role"]], "content": _text(message.get("content"), where)}
        if isinstance(message.get("name"), str):
            clean["name"] = message["name"]
        if message["role"] == "assistant" and message.get("tool_calls"):
            clean["tool_calls"] = _tool_calls(message["tool_calls"], where)
        if message["role"] == "tool":
            clean["tool_call_id"] = str(message.get("tool_call_id", ""))
        out.append(clean)
    return out


def _tools(raw: Any) -> list[dict] | None:
    if raw is None or raw == []:
        return None
    if not isinstance(raw, list):
        raise GatewayError(400, "tools: must be a list of function tools")
    for i, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise GatewayError(400, f"tools[{i}]: must be {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}")
    return raw


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:  # also refuses nan, inf, 10**400
        raise GatewayError(400, f"{name}: {str(value)[:40]}; must be a number in [{low}, {high}]")
    return float(value)


def parse_request(body: Any, agents: Sequence[str]) -> ChatRequest:
    """A checked request, or ``GatewayError``: 404 for a model that names no agent, 400 for the rest."""
    if not isinstance(body, dict):
        raise GatewayError(400, "the body must be a JSON object")
    agent = body.get("model")
    if agent not in agents:
        raise GatewayError(404, f"model {repr(agent)[:60]} is no agent of this team; its agents: {list(agents)}", "model_not_found")
    if body.get("stream"):
        raise GatewayError(400, "stream: streaming is not supported; send stream=false")
    if body.get("n", 1) != 1:
        raise GatewayError(400, f"n: {repr(body.get('n'))[:40]}; one choice per call (call again for another sample)")
    sampling: dict[str, Any] = {}
    temperature = _number(body, "temperature", 0.0, 2.0)
    if temperature is not None:  # a tiny one would divide the logits into inf when scored: greedy, as vLLM samples it
        sampling["temperature"] = temperature if temperature >= GREEDY_BELOW else 0.0
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise GatewayError(400, "top_p: 0; must be in (0, 1] (for greedy replies send temperature=0)")
    if top_p is not None:
        sampling["top_p"] = top_p
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise GatewayError(400, f"max_tokens: {limit!r}; must be a positive integer")
        sampling["max_tokens"] = limit
    stop = body.get("stop")
    if stop is not None:
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > MAX_STOP:
            raise GatewayError(400, f"stop: must be a string or a list of at most {MAX_STOP} non-empty strings")
        if stop:
            sampling["stop"] = stop
    return ChatRequest(agent=agent, messages=_messages(body.get("messages")), tools=_tools(body.get("tools")), sampling=sampling)


def completion(agent: str, call_id: str, message: dict, finish_reason: str, prompt_tokens: int, completion_tokens: int) -> dict:
    """The ``chat.completion`` object of one reply."""
    return {
        "id": f"chatcmpl-{call_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": agent,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens},
    }


Handler = Callable[[ChatRequest], Awaitable[dict]]


@dataclass
class _Session:
    agents: tuple[str, ...]
    handler: Handler


class Gateway:
    """The HTTP server of one process; ``open`` a session per program run, ``close`` it after."""

    def __init__(self, host: str = "127.0.0.1", max_request_bytes: int = 4 * 1024 * 1024):
        self.host, self.max_request_bytes = host, max_request_bytes
        self._sessions: dict[str, _Session] = {}
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> None:
        app = web.Application(client_max_size=self.max_request_bytes)
        app.router.add_get("/{token}/v1/models", self._models)
        app.router.add_post("/{token}/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, agents: Sequence[str], handler: Handler) -> tuple[str, str]:
        """A new session: (its base URL, its token)."""
        token = secrets.token_urlsafe(24)
        self._sessions[token] = _Session(tuple(agents), handler)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/{token}/v1", token

    def close(self, token: str) -> None:
        self._sessions.pop(token, None)

    def _session(self, request: web.Request) -> _Session:
        session = self._sessions.get(request.match_info["token"])
        if session is None:
            raise GatewayError(404, "unknown or finished session", "not_found")
        return session

    async def _models(self, request: web.Request) -> web.Response:
        try:
            session = self._session(request)
        except GatewayError as error:
            return web.json_response(error.body(), status=error.status)
        return web.json_response({"object": "list", "data": [{"id": a, "object": "model", "owned_by": "pettingllms"} for a in session.agents]})

    async def _chat(self, request: web.Request) -> web.Response:
        try:
            session = self._session(request)
            try:
                body = await request.json(loads=json.loads)
            except web.HTTPRequestEntityTooLarge:
                raise GatewayError(413, f"the request is over {self.max_request_bytes} bytes (pettingllms.program.max_request_bytes)") from None
            except (ValueError, RecursionError, LookupError) as error:  # not JSON or not text; too deep, a number too long, an unknown charset
                raise GatewayError(400, f"the body is not JSON Python can read: {type(error).__name__}: {str(error)[:200]}") from None
            return web.json_response(await session.handler(parse_request(body, session.agents)))
        except GatewayError as error:
            return web.json_response(error.body(), status=error.status)


_gateways: dict[tuple[int, str, int], asyncio.Task] = {}


async def gateway(host: str, max_request_bytes: int) -> Gateway:
    """This process's gateway on ``host``, started on the running event loop at first use (one
    start shared by the episodes that ask at once)."""
    key = (id(asyncio.get_running_loop()), host, max_request_bytes)
    if key not in _gateways:
        server = Gateway(host, max_request_bytes)

        async def start() -> Gateway:
            await server.start()
            return server

        _gateways[key] = asyncio.ensure_future(start())
    try:
        return await asyncio.shield(_gateways[key])
    except Exception:
        _gateways.pop(key, None)  # the next episode tries again
        raise
