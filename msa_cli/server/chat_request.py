"""The body of a `/v1/chat/completions` request, checked: each mistake is one clear 400 error."""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("system", "developer", "user", "assistant")


class ApiError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass
class ChatRequest:
    messages: list[dict]  # {"role", "content": str}, "developer" read as "system"
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage counts


def parse_chat_request(body, *, model: str, max_tokens_limit: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    asked = body.get("model", model)
    if asked != model:
        raise ApiError(
            404,
            f"this server serves the model {model!r}, not {asked!r}",
            param="model",
            code="model_not_found",
        )
    n = _number(body, "n", 1, integer=True)
    if n != 1:
        raise ApiError(400, "only n=1 is supported", param="n")
    max_tokens = _number(body, "max_completion_tokens", None, integer=True)
    if max_tokens is None:
        max_tokens = _number(body, "max_tokens", max_tokens_limit, integer=True)
    if not 1 <= max_tokens <= max_tokens_limit:
        raise ApiError(
            400,
            f"max_tokens must be between 1 and {max_tokens_limit:,} on this server "
            f"(msa serve --max-tokens)",
            param="max_tokens",
        )
    temperature = _number(body, "temperature", 0.0)
    if not 0 <= temperature <= 2:
        raise ApiError(400, "temperature must be between 0 and 2", param="temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, "top_p must be above 0 and at most 1", param="top_p")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise ApiError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    return ChatRequest(
        messages=_messages(body.get("messages")),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=_number(body, "seed", None, integer=True),
        stream=stream,
        include_usage=bool(options.get("include_usage")),
    )


def _number(body: dict, name: str, default, *, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ApiError(400, f"{name} must be {'an integer' if integer else 'a number'}", param=name)
    return value


def _messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    checked = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ApiError(
                400,
                f"{where} must be an object whose role is one of {', '.join(ROLES)}",
                param=where,
            )
        role = "system" if m["role"] == "developer" else m["role"]
        checked.append({"role": role, "content": _text(m.get("content"), where)})
    return checked


def _text(content, where: str) -> str:
    """A message's content: a string, or a list of text parts (joined); nothing else is read."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ApiError(
        400,
        f"{where}.content must be a string or a list of text parts (this model reads text only)",
        param=f"{where}.content",
    )
