"""`msa calibrate --index`: the distilled block index (msa.engine.index_calibration). Its fit on
planted needles (the loss falls, its selection finds what a random index misses), its file
(kept for the weights it was distilled from, refused for others), and the command end to end
on the embedded model, measured by the fidelity yardstick."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from msa.app import app
from msa.engine import index_calibration as ic
from msa.engine.evals import fidelity, fidelity_mass
from msa.engine.evals.haystack import shipped_prose
from msa.kernels import block_index
from msa.models.errors import ModelError


def _planted(seed=0, hkv=2, group=2, n=2048, t=256, d=16, block=16):
    """Each query matching one far key strongly (its needle), the queries of a group alike and
    in 12 of the 16 channels, amid keys whose largest variance lies in the other 4 (which the
    index must learn to ignore: its start, the keys' principal directions, leans on them)."""
    g = torch.Generator().manual_seed(seed)
    keys = 0.5 * torch.randn(hkv, n, d, generator=g)
    keys[..., 12:] *= 100  # loud channels no query reads
    z = torch.zeros(hkv, 1, t, d)
    z[..., :12] = 2 * torch.randn(hkv, 1, t, 12, generator=g)
    q = (z + 0.1 * torch.randn(hkv, group, t, d, generator=g)).view(hkv * group, t, d)
    pos = torch.arange(n - t, n)
    needles = block + torch.randperm(n - t - 2 * block, generator=g)[:t]  # one a query
    keys[:, needles] = 5 * z[:, 0]
    return q, keys, pos, needles, block


def _top1_found(logp, needles, block) -> float:
    """The share of queries whose best block (max-pooled) holds their needle."""
    hkv = logp.shape[0]
    scores = block_index.block_scores(logp, hkv, block, "max")  # [Hkv, T, nb]
    best = scores[..., : (needles.max() // block + 1)].argmax(-1)  # far blocks only
    return float((best == (needles // block)[None]).float().mean())


def test_the_fit_lowers_the_loss_and_finds_needles_a_random_index_misses():
    q, keys, pos, needles, block = _planted()
    held_out = torch.zeros(len(pos), dtype=torch.bool)
    held_out[::4] = True
    fit = ic.fit_layer(q, keys, pos, dim=12, steps=400, held_out=held_out)
    assert fit.kl_after < fit.kl_before / 2
    test = held_out.nonzero().flatten()
    learned = block_index.learned_log_probs(q[:, test], keys, pos[test], *fit.projections)
    g = torch.Generator().manual_seed(1)
    random_q = torch.randn(fit.projections[0].shape, generator=g)
    random_k = torch.randn(fit.projections[1].shape, generator=g)
    chance = block_index.learned_log_probs(q[:, test], keys, pos[test], random_q, random_k)
    assert _top1_found(learned, needles[test], block) >= 0.5
    assert _top1_found(chance, needles[test], block) <= 0.1


def test_the_index_file_is_kept_for_its_weights_and_refused_for_others(tmp_path):
    index = ic.LearnedIndex("abc123", 4)
    index.layers[2] = (torch.randn(2, 3, 8, 4), torch.randn(2, 8, 4))
    path = ic.index_path(tmp_path / "calibration", "abc123")
    ic.save_index(index, path)
    back = ic.load_index(path, "abc123")
    assert back.dim == 4 and list(back.layers) == [2]
    assert all(torch.equal(a, b) for a, b in zip(back.layers[2], index.layers[2]))
    with pytest.raises(ModelError, match="distilled from other weights"):
        ic.load_index(path, "other")
    assert ic.load_index(tmp_path / "none.index.safetensors", "abc123") is None
    path.write_bytes(b"not safetensors")
    with pytest.raises(ModelError, match="unreadable"):
        ic.load_index(path, "abc123")


def test_the_command_distills_and_the_yardstick_measures_it(embedded, tmp_path):
    result = CliRunner().invoke(
        app,
        ["calibrate", "--index", "-l", "1k", "--index-dim", "8", "--index-steps", "60", "--json"],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["layer"] for r in rows] == list(range(embedded.config.num_hidden_layers))
    # the deeper layers' attention is peaked, and the index learns it
    deep = rows[len(rows) // 2 :]
    assert sum(r["KL after"] for r in deep) < 0.7 * sum(r["KL before"] for r in deep)
    assert "MSA index stored in" in result.stderr
    from msa.engine.paths import cache_dir, calibrations_dir

    path = ic.index_path(calibrations_dir(cache_dir(None)), embedded.digest)
    learned = ic.load_index(path, embedded.digest)
    assert learned.dim == 8
    (row,) = fidelity.measure_document(
        embedded,
        shipped_prose(),
        length=1536,
        seed=0,
        candidates=[fidelity_mass.Candidate.parse(s) for s in ("l-max-k4", "l-max-k1000")],
        learned=learned,
        layout={"single": 1, "near": 0, "multi": 0},
    )
    every = [v for role in row.mass["l-max-k1000"].values() for x in role.values() for v in x]
    assert min(every) > 0.999  # every block read: all of dense attention
    assert max(row.blocks["l-max-k4"].values()) <= 2 + 4 + 1
    # without a distilled index for the model, a learned candidate is refused in one line
    missing = CliRunner().invoke(
        app,
        ["eval", "fidelity", "-l", "1k", "--candidates", "l-max-k4", "--cache-dir", str(tmp_path)],
    )
    assert missing.exit_code == 3 and "msa calibrate --index" in missing.stderr
