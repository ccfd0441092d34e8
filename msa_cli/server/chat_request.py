"""The body of a `/v1/chat/completions` request, checked: each mistake is one clear 400 error,
and so is every parameter this server cannot honour (never silently ignored)."""

from __future__ import annotations

from dataclasses import dataclass, field

ROLES = ("system", "developer", "user", "assistant")
MAX_STOPS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256  # each stop string is looked for at every token: a bound on that work
MAX_SEED = 2**63  # seeds are 0 <= seed < 2**63 (PyTorch's generators take 64 bits)
MAX_SALT_CHARS = 256


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
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (
            status,
            message,
            param,
            code,
            kind,
        )
        self.headers = headers

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
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage counts
    stop: list[str] = field(default_factory=list)  # the answer ends before the first of these
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    cache_salt: str | None = None  # prefix-cache blocks are shared only by requests of one salt


def parse_chat_request(body, *, model: str, max_tokens_limit: int) -> ChatRequest:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    asked = body.get("model", model)
    if asked != model:
        raise ApiError(
            404,
            f"this server serves the model {model!r}, not {str(asked)[:200]!r}",
            param="model",
            code="model_not_found",
        )
    _refuse_unsupported(body)
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
    stream = body.get("stream", False)
    if not isinstance(stream, bool) and stream is not None:
        raise ApiError(400, "stream must be true or false", param="stream")
    options = body.get("stream_options")
    if options is None:
        options = {}
    elif not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    seed = _number(body, "seed", None, integer=True)
    if seed is not None and not 0 <= seed < MAX_SEED:
        raise ApiError(400, f"seed must be between 0 and {MAX_SEED - 1}", param="seed")
    return ChatRequest(
        messages=_messages(body.get("messages")),
        max_tokens=max_tokens,
        temperature=_in_range(body, "temperature", 0.0, 0, 2),
        top_p=_top_p(body),
        seed=seed,
        stream=bool(stream),
        include_usage=bool(options.get("include_usage")),
        stop=_stop(body.get("stop")),
        presence_penalty=_in_range(body, "presence_penalty", 0.0, -2, 2),
        frequency_penalty=_in_range(body, "frequency_penalty", 0.0, -2, 2),
        cache_salt=_cache_salt(body.get("cache_salt")),
    )


def _refuse_unsupported(body: dict) -> None:
    """Parameters that would change the answer in ways this server does not implement."""
    if body.get("logprobs") not in (None, False):
        raise ApiError(400, "logprobs is not supported by this server", param="logprobs")
    if body.get("top_logprobs") is not None:
        raise ApiError(400, "top_logprobs is not supported by this server", param="top_logprobs")
    if body.get("tools") not in (None, []):
        raise ApiError(
            400, "tools (function calling) is not supported by this server", param="tools"
        )
    if body.get("tool_choice") not in (None, "none"):
        raise ApiError(400, "tool_choice is not supported by this server", param="tool_choice")
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError(
            400,
            'response_format is not supported by this server (only {"type": "text"})',
            param="response_format",
        )
    if body.get("logit_bias") not in (None, {}):
        raise ApiError(400, "logit_bias is not supported by this server", param="logit_bias")


def _number(body: dict, name: str, default, *, integer: bool = False):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise ApiError(400, f"{name} must be {'an integer' if integer else 'a number'}", param=name)
    return value


def _in_range(body: dict, name: str, default: float, low: float, high: float) -> float:
    value = _number(body, name, default)
    if not low <= value <= high:  # NaN too
        raise ApiError(400, f"{name} must be between {low} and {high}", param=name)
    return value


def _top_p(body: dict) -> float:
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise ApiError(400, "top_p must be above 0 and at most 1", param="top_p")
    return top_p


def _stop(stop) -> list[str]:
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
    ):
        raise ApiError(
            400,
            f"stop must be a string or a list of at most {MAX_STOPS} strings, each of 1 to "
            f"{MAX_STOP_CHARS} characters",
            param="stop",
        )
    return stops


def _cache_salt(salt) -> str | None:
    if salt is not None and not (isinstance(salt, str) and 0 < len(salt) <= MAX_SALT_CHARS):
        raise ApiError(
            400,
            f"cache_salt must be a string of 1 to {MAX_SALT_CHARS} characters",
            param="cache_salt",
        )
    return salt


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
