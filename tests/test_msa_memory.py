"""With K/V in mapped files, a long prefill's memory does not grow with the input beyond the store.

Each run is a fresh process that prefills a small random model whose K/V are large (16 KB a
token) and samples its anonymous resident memory (RssAnon: what must fit in RAM; pages of a
mapped file are page cache the OS can drop) after every chunk. The same run with K/V in memory
shows the measurement sees the store when it is there. glibc's allocator is told to return
freed memory at once (fixed mmap and trim thresholds), so RssAnon shows live memory rather than
what the allocator keeps for reuse (~100 MB of noise at 32K tokens otherwise).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

CHILD = textwrap.dedent("""
    import sys, tempfile, torch
    from msa.models import ModelConfig, Transformer
    from msa.engine.bench import anon_rss_mb
    from msa.engine.generate import prefill

    n_tokens, in_files = int(sys.argv[1]), sys.argv[2] == "files"
    torch.manual_seed(0)
    config = ModelConfig.tiny(num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8,
                              hidden_size=128, head_dim=64, intermediate_size=256, kv_block_size=64,
                              max_position_embeddings=4096)
    model = Transformer(config).eval()
    ids = torch.randint(0, config.vocab_size, (n_tokens,)).tolist()
    prefill(model, model.new_cache(), ids[:2048])          # warm up: allocator pools, thread pools
    base = peak = anon_rss_mb()
    def sample(_):
        global peak
        peak = max(peak, anon_rss_mb())
    with tempfile.TemporaryDirectory() as spill:
        cache = model.new_cache(capacity=n_tokens, storage_dir=spill if in_files else None)
        prefill(model, cache, ids, progress=sample)
        print(peak - base, cache.nbytes() / 2**20)
""")

SHORT, LONG = 2048, 20480


def _growth_mb(n_tokens: int, where: str) -> tuple[float, float]:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n_tokens), where],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
        env=env,
    )
    growth, store = out.stdout.split()
    return float(growth), float(store)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RssAnon from /proc")
def test_memory_does_not_grow_with_the_input_beyond_the_store():
    short_growth, _ = _growth_mb(SHORT, "files")
    long_growth, long_store = _growth_mb(LONG, "files")
    assert long_store == pytest.approx(LONG * 8 / 1024)  # 160 MB of fp16 K/V
    # 18K more tokens, 144 MB more K/V, in files: anonymous memory grows by the key summaries
    # (fp32, two frames of min and max: 1/8 of the fp16 keys here, 10 MB) and little else
    assert long_growth - short_growth < 0.1 * long_store, (short_growth, long_growth)
    in_memory_growth, _ = _growth_mb(LONG, "memory")
    assert (
        in_memory_growth - short_growth > 0.7 * long_store
    )  # the same check sees a store in memory
