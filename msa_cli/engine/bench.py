"""Speed of the engine at chosen context lengths (`msa bench`)."""

from __future__ import annotations

import functools
import resource
import time

from .peaks import median_seconds, peak_shares

QUESTION_TOKENS = 64  # a bench prompt's tail read as a question


def peak_rss_mb() -> float:
    """The process's peak resident memory so far (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def anon_rss_mb() -> float:
    """The process's resident memory that is not a mapped file (K/V spilled to files are page
    cache the OS can drop; this is what must fit in RAM). 0 where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def prefill_as_asked(model, cache, ids: list[int]):
    """Prefill a bench prompt as `msa ask` reads a document and its question: all but the last
    `QUESTION_TOKENS` as the document, those as the question (whose blocks the answer's steps
    read again). The last token's logits."""
    from .generate import prefill

    document = max(0, len(ids) - QUESTION_TOKENS)
    prefill(model, cache, ids[:document])
    return prefill(model, cache, ids[document:], question_from=document)


def run_e2e(
    loaded, lengths: list[int], *, decode_tokens: int, settings=None, spill_dir=None, peak=None
) -> list[dict]:
    """Prefill `length` synthetic tokens, then decode `decode_tokens` greedily, for each length,
    under the attention `settings` (AttentionSettings; None: the defaults). As in `msa ask`,
    the prompt's last tokens are prefilled as a question (`prefill_as_asked`), and K/V too
    large for memory live in files under `spill_dir`.

    Each row also gives what the weight products achieved (weight_reads.py counts them):
    prefill's GFLOP/s and decode's GB/s of weights read; with `peak` (a row of `msa bench
    peak`, peaks.py), their percentage of the machine's peaks."""
    import torch

    from msa.models.weight_reads import weight_reads

    from .generate import new_cache, step

    model = loaded.model
    reads = weight_reads(model)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for length in lengths:
        ids = torch.randint(256, loaded.config.vocab_size, (length,), generator=generator).tolist()
        capacity = length + decode_tokens
        cache = new_cache(model, capacity=capacity, attention=settings, spill_dir=spill_dir)
        start = time.perf_counter()
        logits = prefill_as_asked(model, cache, ids)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(decode_tokens):
            logits = step(model, cache, int(torch.argmax(logits)))
        decode_s = time.perf_counter() - start
        prefill_gflop_s = reads.prefill_flops(length) / prefill_s / 1e9
        decode_gb_s = reads.decode_bytes * decode_tokens / decode_s / 1e9
        row = {
            "length": length,
            "prefill_tok_s": round(length / prefill_s, 2),
            "decode_tok_s": round(decode_tokens / decode_s, 2),
            "prefill_gflop_s": round(prefill_gflop_s, 1),
            "decode_gb_s": round(decode_gb_s, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "anon_rss_mb": round(anon_rss_mb(), 1),
            "kv_in_files": cache.storage_dir is not None,
        }
        if peak is not None:
            row.update(peak_shares(prefill_gflop_s, decode_gb_s, reads.prefill_dtype, peak))
        rows.append(row)
        del cache
    return rows


def run_attention(
    lengths: list[int],
    *,
    n_heads: int,
    n_kv_heads: int,
    head_dim: int,
    block_size: int,
    topk: int,
    local_blocks: int,
    sink_blocks: int,
    device: str = "cpu",
    repeats: int = 5,
) -> list[dict]:
    """One decode step of one layer's attention, dense against MSA, on the same random K/V.

    MSA's step is what a decode step pays: score every block summary, pick the top-k blocks,
    attend over them. Summaries are made once per full block, so their cost is not in the step.
    """
    import torch

    import msa.kernels as K

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    generator = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for length in lengths:
        k = torch.randn(n_kv_heads, length, head_dim, generator=generator).to(device)
        v = torch.randn(n_kv_heads, length, head_dim, generator=generator).to(device)
        q = torch.randn(n_heads, head_dim, generator=generator).to(device)
        summaries = K.block_summaries(k, block_size, "minmax")

        dense = functools.partial(_dense_step, K, sync, q, k, v)
        msa = functools.partial(
            _msa_step, K, sync, q, k, v, summaries, length, block_size, topk, local_blocks,
            sink_blocks,
        )  # fmt: skip
        dense_ms, msa_ms = (1000 * median_seconds(fn, repeats) for fn in (dense, msa))
        del dense, msa  # their K/V go with k, v below
        elt = k.element_size()
        width = K.selection_width(topk, local_blocks, sink_blocks)
        selected_tokens = min(length, width * block_size)
        rows.append(
            {
                "length": length,
                "dense_ms": round(dense_ms, 3),
                "msa_ms": round(msa_ms, 3),
                "speedup": round(dense_ms / msa_ms, 2),
                "bytes_read_dense": 2 * length * n_kv_heads * head_dim * elt,
                "bytes_read_msa": summaries.numel() * summaries.element_size()
                + 2 * selected_tokens * n_kv_heads * head_dim * elt,
            }
        )
        del k, v, summaries
    return rows


def _dense_step(K, sync, q, k, v) -> None:
    K.dense_attention(q, k, v)
    sync()


def _msa_step(K, sync, q, k, v, summaries, length, block_size, topk, local_blocks, sink_blocks):
    scores = K.score_blocks(q, summaries)
    idx = K.select_blocks(
        scores,
        n_tokens=length,
        block_size=block_size,
        topk=topk,
        local_blocks=local_blocks,
        sink_blocks=sink_blocks,
    )
    K.sparse_decode_attention(q, k, v, idx, block_size)
    sync()
