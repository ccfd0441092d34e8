"""`msa eval fidelity`: the share of dense attention MSA's selected blocks hold, and the answers'
teacher-forced log-likelihood (msa.engine.evals.fidelity). Registered on `msa eval` by the app."""

from __future__ import annotations

import json
import sys

import typer

from .attention_options import (
    MassOption,
    SelectionOption,
    TopkOption,
    attention_settings,
)
from .errors import reports_errors
from .options import (
    CacheDirOption,
    DtypeOption,
    ModelOption,
    QuantOption,
    ResultsOption,
    ThreadsOption,
    check_precision,
    parse_lengths,
)

# how a document is sized (2: the template's head and the needles count toward the length); rows
# measured on documents sized otherwise are not resumed
DOCUMENT = 2


@reports_errors
def eval_fidelity(
    lengths: str = typer.Option(
        "8k", "--lengths", "-l", help="Document lengths in the model's tokens; k, m suffixes."
    ),
    seeds: str = typer.Option(
        "0,1", "--seeds", help="Seeds of the documents, comma-separated: one document each."
    ),
    candidates: str = typer.Option(
        None,
        "--candidates",
        help="Index selections measured beside the engine's, comma-separated: "
        "i<bits>-<max|mass>-k<topk> or i<bits>-<max|mass>-p<share>-k<most>, l in place of "
        "i<bits> for the index `msa calibrate --index` distilled [default: a sweep of bits, "
        "pooling and budgets]",
    ),
    haystack: str | None = typer.Option(
        None, "--haystack", help="A prose text file to hide needles in (default: a shipped book)."
    ),
    results: str | None = ResultsOption,
    model: str = ModelOption,
    topk: int = TopkOption,
    selection: str = SelectionOption,
    mass: float | None = MassOption,
    threads: int | None = ThreadsOption,
    quant: str | None = QuantOption,
    dtype: str = DtypeOption,
    json_out: bool = typer.Option(
        False, "--json", help="Print one JSON object: the tables and each layer's median."
    ),
    cache_dir: str | None = CacheDirOption,
):
    """How much of dense attention MSA's selected blocks hold, layer by layer, for a question's
    and an answer's queries over a long document, and the answers' log-likelihood under MSA and
    dense attention (teacher-forced). Index candidates select for the same queries.

    Tune a choice on some seeds, then report it with --seeds it never saw.

    Example: msa eval fidelity -l 16k --seeds 2,3,4,5 --results fidelity.jsonl
    """
    from msa.models.attention_settings import DEFAULT_KV_DTYPE

    from ..engine.evals import fidelity, fidelity_mass, fidelity_summary
    from ..engine.evals.haystack import read_prose, shipped_prose
    from ..engine.evals.results import ResultsFile, item_id
    from ..engine.loading import set_threads
    from ..engine.model import load as load_model
    from .output import print_rows

    check_precision(quant, dtype)
    sizes = parse_lengths(lengths)
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"{seeds!r}: seeds are integers", param_hint="--seeds") from None
    chosen = fidelity_mass.parse_candidates(candidates or fidelity_mass.DEFAULT_CANDIDATES)
    settings = attention_settings("auto", topk, None, 1, DEFAULT_KV_DTYPE, selection, mass)
    prose = read_prose(haystack) if haystack else shipped_prose()
    store = ResultsFile(results)
    set_threads(threads)
    engine = load_model(model, quant=quant, dtype=dtype, threads=threads, cache_dir=cache_dir)
    learned = None
    if any(c.bits == fidelity_mass.LEARNED for c in chosen):
        from ..engine.index_calibration import load_index, model_index_path

        digest = engine.loaded.digest
        learned = load_index(model_index_path(cache_dir, digest), digest)
    names = ",".join(c.name for c in chosen)
    # what makes a row besides quest's defaults (rows of quest's keep their first ids)
    chosen_selection = (
        {"selection": selection, "top_p": mass, "far_blocks": "true distances"}
        if selection != "quest"
        else {}
    )
    records = []
    for length in sizes:
        for seed in seed_list:

            def id_of(key, length=length, seed=seed):
                return item_id(model=engine.name, length=length, seed=seed, key=key,
                               haystack=prose.digest, topk=topk, candidates=names,
                               document=DOCUMENT, **chosen_selection)  # fmt: skip

            def progress(row):
                store.add(json.loads(fidelity.row_json(row)))
                print(
                    f"  {row.length:>8,} seed {row.seed} {row.kind:>6} {row.key}: "
                    f"logprob msa {row.logprob['msa']:.2f} dense {row.logprob['dense']:.2f} "
                    f"({row.seconds:.1f} s)",
                    file=sys.stderr,
                )

            fidelity.measure_document(
                engine.loaded,
                prose,
                length=length,
                seed=seed,
                candidates=chosen,
                learned=learned,
                attention=settings,
                on_question=progress,
                skip=lambda key, id_of=id_of: id_of(key) in store.done,
                id_of=id_of,
            )
            questions, _ = fidelity.plant(prose, seed, fidelity.DEFAULT_LAYOUT)
            records += [store.done[id_of(q.key)] for q in questions if id_of(q.key) in store.done]
    answers = fidelity_summary.answer_summary(records)
    if json_out:
        summary = {
            role: fidelity_summary.summary_rows(records, role) for role in ("question", "answer")
        }
        layers = fidelity_summary.layer_medians(records)
        print(json.dumps({"mass": summary, "layer_medians": layers, "answers": answers}))
        return
    what = f"{engine.name}, {', '.join(f'{n:,}' for n in sizes)} tokens, seeds {seeds}"
    for role in ("question", "answer"):
        title = f"msa eval fidelity: {what}: share of dense attention held, the {role}'s queries"
        print_rows(fidelity_summary.summary_rows(records, role), False, title)
    print_rows(answers, False, "answers, teacher-forced")
