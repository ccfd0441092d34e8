"""Reading a prompt into a K/V cache: the prefix cache's blocks for its context, the chunks
of what they lack, then the question.

The context (head + document) and the tail are prefilled apart, and the context's chunks end at
multiples of the chunk size whatever the cache holds of it: a full cache hit gives the same
logits, bit for bit, as no cache, and a block recomputed from a chunk's start (a corrupted one)
gets the K/V the first fill gave it.
"""

from __future__ import annotations

from collections.abc import Generator

from msa.models.attention_plan import with_defaults
from msa.models.attention_settings import AttentionSettings
from msa.models.msa_defaults import MsaDefaults

from . import generate
from .documents import Context, ContextFile, Document
from .prefix_cache import CacheOptions, PrefixCache, identity
from .prefix_cache.tokens import TokenMemo
from .prompt import Prompt
from .read_speed import speed_key
from .settings import Settings


def prompt_chunks(
    model, cache, context: list[int], tail: list[int], stored: PrefixCache | None, observer=None
) -> Generator[int, None, object]:
    """Prefill what `cache` lacks of `context`, then `tail`, yielding each chunk's token count;
    returns the last token's logits (None without a tail). Each finished chunk of the context
    is saved to `stored`."""
    if cache.length < len(context):
        chunks = generate.prefill_chunks(
            model, cache, context[cache.length :], observer=observer, aligned=True
        )
        for n in chunks:
            yield n
            if stored:
                stored.save(cache)
    if not tail:
        return None
    return (
        yield from generate.prefill_chunks(
            model, cache, tail, question_from=len(context), observer=observer
        )
    )


def prefill_prompt(model, cache, prompt: Prompt, stored: PrefixCache | None = None):
    """`prompt_chunks` for a whole prompt, run to its end: the last token's logits."""
    context = prompt.ids[: prompt.context_length]
    return generate.drain(prompt_chunks(model, cache, context, prompt.tail, stored))


def as_context(documents: Document | Context) -> Context:
    if isinstance(documents, Context):
        return documents
    whole = ContextFile(documents.name, 0, len(documents.text), documents.sections)
    return Context(name=documents.name, text=documents.text, files=[whole])


def read_speed_key(loaded, mode: str) -> str:
    import torch

    return speed_key(loaded, torch.get_num_threads(), mode)


def token_memo(loaded, options: CacheOptions | None) -> TokenMemo | None:
    """The prefix cache's memory of long documents' token ids (None without a prefix cache)."""
    if options is None:
        return None
    # documents are tokenized as plain text (special tokens' strings as characters): ids kept
    # before that was so are not theirs
    plain_text = f"{loaded.tokenizer.digest}:plain-text"
    return TokenMemo(options.root, plain_text, read_only=options.read_only)


def attention_identity(cache, asked: AttentionSettings, model_defaults: MsaDefaults) -> dict:
    """The attention settings that change K/V, as a plain dict for the prefix cache's keys: with
    the topk and local blocks `asked` for (a topk left to the model: the model's), not those
    `generate.new_cache` capped to the cache's blocks (which vary with the question and
    --max-tokens): a document's K/V are the same under both, since each reads every block it
    may."""
    asked = with_defaults(asked, model_defaults)
    identity = {**cache.settings.identity(), "block_size": cache.block_size}
    for name in ("topk", "local_blocks"):
        if name in identity:
            identity[name] = getattr(asked, name)
    return identity


def open_prefix_cache(
    loaded, cache, prompt: Prompt, source: str, settings: Settings
) -> PrefixCache | None:
    """The prefix cache's blocks for `prompt`'s context (None: no prefix cache, or no context)."""
    if settings.prefix_cache is None or prompt.context_length == 0:
        return None
    ident = identity(
        loaded,
        dtype=cache.dtype,
        block_size=cache.block_size,
        attention=attention_identity(cache, settings.attention, loaded.model.msa_defaults),
    )
    if settings.cache_salt is not None:  # the chain's root: another salt never finds a block
        ident["salt"] = settings.cache_salt
    return PrefixCache(
        settings.prefix_cache,
        identity=ident,
        context=prompt.ids[: prompt.context_length],
        block_size=cache.block_size,
        source="stdin" if source == "-" else source,
        model=loaded.name,
        note=settings.note or (lambda message: None),
        chunk_tokens=generate.PREFILL_CHUNK,
    )
