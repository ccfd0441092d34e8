"""`msa ask/chat --server URL`: the same prompts, sent to an OpenAI-compatible server.

Any server that speaks `/v1/chat/completions` with streaming will do: vLLM, SGLang, llama.cpp's
server, `msa serve`. The prompt is the one the local engine reads (`prompt.user_message`):
the document first and the question last, so a server's own prefix cache (vLLM's automatic
prefix caching, SGLang's RadixAttention, msa's) holds the document after the first question.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2
import typer

from msa.models.errors import InputTooLongError, MsaError

from .options import given_as


class ServerError(MsaError):
    """The server could not be reached, refused the request, or did not answer in time."""

    exit_code = 6


@dataclass
class RemoteAnswer:
    """What the server says about an answer; complete once the pieces' iterator ends."""

    model: str
    text: str = ""
    prompt_tokens: int | None = None
    cached_tokens: int | None = (
        None  # only when the server reports it (vLLM: --enable-prompt-tokens-details)
    )
    generated_tokens: int | None = None
    finish_reason: str = ""
    first_token_at: float | None = None

    def as_json(self, *, server: str, started_at: float) -> dict:
        return {
            "answer": self.text,
            "model": self.model,
            "server": server,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "generated_tokens": self.generated_tokens,
            "finish_reason": self.finish_reason,
            "ttft_s": round((self.first_token_at or time.time()) - started_at, 4),
        }


def api_base(url: str) -> str:
    """`http://host:8000` or `http://host:8000/v1` -> `http://host:8000/v1`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise typer.BadParameter(
            f"{url!r} is not an http:// or https:// URL",
            param_hint=given_as("--server", "MSA_SERVER", url),
        )
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


class Server:
    def __init__(self, url: str, *, api_key: str | None, timeout: float):
        self.url = api_base(url)
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx2.Client(base_url=self.url, headers=headers, timeout=timeout)

    def model(self, wanted: str, *, chosen: bool) -> str:
        """`wanted` if the server serves it, else, unless the user chose it, the server's only
        model."""
        served = [m["id"] for m in self._json(self._call("GET", "/models")).get("data", [])]
        if wanted in served:
            return wanted
        if not chosen and len(served) == 1:
            return served[0]
        listed = ", ".join(served) or "none"
        raise ServerError(
            f"the server at {self.url} does not serve {wanted!r} (it serves: {listed}); pick one "
            "with --model"
        )

    def stream_chat(
        self,
        messages: list[dict],
        *,
        model: str,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
    ) -> tuple[RemoteAnswer, Iterator[str]]:
        """Start an answer; returns its record and an iterator of text pieces as they arrive."""
        body = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if seed is not None:
            body["seed"] = seed
        answer = RemoteAnswer(model=model)
        return answer, self._pieces(body, answer)

    def _pieces(self, body: dict, answer: RemoteAnswer) -> Iterator[str]:
        with self._guarded():
            with self.http.stream("POST", "/chat/completions", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    self._refused(response)
                for data in _sse_data(response.iter_lines()):
                    try:
                        event = json.loads(data)
                    except ValueError:
                        raise ServerError(
                            f"the server at {self.url} sent an event that is not JSON: "
                            f"{data[:80]!r}"
                        ) from None
                    if "error" in event:  # a server that streams at once reports it here
                        if _too_long(event, _message(event)):
                            raise InputTooLongError(f"the server at {self.url}: {_message(event)}")
                        raise ServerError(
                            f"the server at {self.url} stopped the answer: {_message(event)}"
                        )
                    if event.get("usage"):
                        _read_usage(answer, event["usage"])
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            answer.first_token_at = answer.first_token_at or time.time()
                            answer.text += piece
                            yield piece
                        answer.finish_reason = choice.get("finish_reason") or answer.finish_reason

    def _call(self, method: str, path: str) -> httpx2.Response:
        with self._guarded():
            response = self.http.request(method, path)
        if response.status_code != 200:
            self._refused(response)
        return response

    def _json(self, response: httpx2.Response) -> dict:
        try:
            return response.json()
        except ValueError:
            raise ServerError(
                f"{self.url} did not answer as an OpenAI-compatible server (no JSON)"
            ) from None

    @contextlib.contextmanager
    def _guarded(self):
        """httpx2's transport errors as one-line `ServerError`s."""
        try:
            yield
        except httpx2.TimeoutException:
            raise ServerError(
                f"the server at {self.url} did not answer within {self.timeout:g} s (--timeout)"
            ) from None
        except httpx2.TransportError as e:
            raise ServerError(
                f"cannot reach the server at {self.url}: {e or type(e).__name__}"
            ) from None

    def _refused(self, response: httpx2.Response):
        body = _json_or_text(response)
        message, status = _message(body), response.status_code
        if status in (401, 403):
            raise ServerError(
                f"the server at {self.url} refused the API key (HTTP {status}: {message}); "
                f"give the right one with --api-key or MSA_API_KEY"
            )
        if status == 400 and _too_long(body, message):
            raise InputTooLongError(f"the server at {self.url}: {message}")
        raise ServerError(f"the server at {self.url} answered HTTP {status}: {message}")


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The data of each server-sent event, up to `[DONE]`."""
    for line in lines:
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                return
            yield data


def _read_usage(answer: RemoteAnswer, usage: dict) -> None:
    answer.prompt_tokens = usage.get("prompt_tokens")
    answer.generated_tokens = usage.get("completion_tokens")
    answer.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")


def _too_long(body, message: str) -> bool:
    """A refusal for length: msa serve's (and OpenAI's) error code, or vLLM's message."""
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    return code == "context_length_exceeded" or "maximum context length" in message.lower()


def _json_or_text(response: httpx2.Response):
    try:
        return response.json()
    except ValueError:
        return response.text.strip()[:200] or response.reason_phrase


def _message(body) -> str:
    """The message of an error body: OpenAI's {"error": {"message"}}, FastAPI's {"detail"}, or
    text."""
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            return str(error.get("message") or error.get("detail") or error)
        return str(error)
    return str(body)
