"""`msa serve`'s application on a tiny random model, called in-process (no socket): fast enough
for hundreds of requests. Its answers are deterministic nonsense, which is all a test of the
server's checks, limits and stop strings needs."""

from __future__ import annotations

import contextlib

import httpx2
from arch_checks import VOCAB, tiny_tokenizer_json
from tiny_checkpoints import CHAT_TEMPLATE, tiny_model
from tokenizers import Tokenizer

from msa.models.attention_settings import AttentionSettings
from msa.models.loading import LoadedModel
from msa.models.tokenizer import ChatTemplate, TextTokenizer
from msa.server.run import make_app

TINY = "tiny-random"


def tiny_loaded(template: str = CHAT_TEMPLATE) -> LoadedModel:
    tokenizer = TextTokenizer(
        Tokenizer.from_str(tiny_tokenizer_json()), ChatTemplate(template), eos_ids=[2]
    )
    return LoadedModel(TINY, tiny_model(vocab_size=VOCAB), tokenizer, "tiny", "test")


def tiny_app(loaded: LoadedModel | None = None, **options):
    """The application; `options`: make_app's and create_app's (api_key, queue_size, ...)."""
    options = {
        "cache_dir": None,
        "no_cache": True,
        "queue_size": 4,
        "api_key": None,
        "max_request_bytes": 100_000,
        "max_tokens": 32,
        **options,
    }
    return make_app(loaded or tiny_loaded(), AttentionSettings(mode="dense"), **options)


@contextlib.asynccontextmanager
async def asgi_client(app, base_url: str = "http://127.0.0.1:8000"):
    """An httpx2 client calling `app` in-process, its lifespan (the engine's thread) running."""
    async with app.router.lifespan_context(app):
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url=base_url) as client:
            yield client
