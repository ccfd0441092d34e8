"""`msa pull owner/repo:QUANT` (and owner/repo/file.gguf) against a hub on loopback
(tests/hub_server.py) serving several quants of a GGUF beside each other: exactly the file asked
for is downloaded (every part of a split one), bad tags are one line before any download, the
pulled model answers with the network off, and `msa models rm` of the same name deletes that
file and what msa made of it, nothing else. Never the real network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hub_server import FakeHub, serve_hub
from typer.testing import CliRunner

from msa.app import app
from msa.engine.prefix_cache import format_size
from msa.models.hub_gguf import GgufRef, find, gguf_files, quant_of

REPO = "acme/tiny-GGUF"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> bytes:
    from test_loaders import tiny_config
    from tiny_checkpoints import random_llama_weights, write_tiny_gguf

    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf"
    config = tiny_config()
    write_tiny_gguf(path, config, random_llama_weights(config), qtype="Q8_0")
    return path.read_bytes()


def repo_files(data: bytes) -> dict[str, bytes]:
    """A repository as uploaders lay them out: quants beside each other, a split one in a
    folder, a vision projector and a README. The bytes differ so a mix-up shows."""
    names = [
        "tiny-F16.gguf",
        "tiny-IQ4_XS.gguf",
        "tiny-Q4_K_M.gguf",
        "tiny-q8_0.gguf",
        "tiny-UD-Q5_K_XL.gguf",
        "Q6_K/tiny-Q6_K-00001-of-00002.gguf",
        "Q6_K/tiny-Q6_K-00002-of-00002.gguf",
        "mmproj-tiny-F16.gguf",
    ]
    files = {n: data + n.encode() for n in names}
    return files | {"README.md": b"# tiny\n"}


@pytest.fixture
def hub(tiny_gguf, monkeypatch):
    fake = FakeHub()
    fake.add(REPO, repo_files(tiny_gguf))
    fake.add("acme/no-gguf", {"README.md": b"# nothing\n"})
    with serve_hub(fake) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        yield fake


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def downloaded(hub: FakeHub) -> list[str]:
    return sorted(
        r.path.split("/resolve/", 1)[1].split("/", 1)[1]  # after the revision
        for r in hub.log
        if r.method == "GET" and "/resolve/" in r.path
    )


LISTING = {n: len(n) for n in repo_files(b"")}


@pytest.mark.parametrize(
    "ref,chosen",
    [
        (GgufRef(REPO, tag="Q4_K_M"), "tiny-Q4_K_M.gguf"),
        (GgufRef(REPO, tag="Q8_0"), "tiny-q8_0.gguf"),  # names compared without case
        (GgufRef(REPO, tag="Q5_K_XL"), "tiny-UD-Q5_K_XL.gguf"),
        (GgufRef(REPO, tag="UD-Q5_K_XL"), "tiny-UD-Q5_K_XL.gguf"),
        (GgufRef(REPO, tag="Q6_K"), "Q6_K/tiny-Q6_K-00001-of-00002.gguf"),
        (GgufRef(REPO), "tiny-Q4_K_M.gguf"),  # the default
        (
            GgufRef(REPO, path="Q6_K/tiny-Q6_K-00002-of-00002.gguf"),
            "Q6_K/tiny-Q6_K-00001-of-00002.gguf",
        ),
        (GgufRef(REPO, tag="Q3_K_M"), None),
        (GgufRef(REPO, tag="F32"), None),
        (GgufRef(REPO, path="tiny-Q2_K.gguf"), None),
    ],
)
def test_the_file_a_reference_names(ref, chosen):
    found = find(gguf_files(LISTING), ref)
    assert (found and found.path) == chosen


def test_files_are_grouped_and_their_quants_read_from_their_names():
    files = gguf_files(LISTING)
    assert [(f.path, f.quant, len(f.parts)) for f in files] == [
        ("Q6_K/tiny-Q6_K-00001-of-00002.gguf", "Q6_K", 2),
        ("tiny-F16.gguf", "F16", 1),
        ("tiny-IQ4_XS.gguf", "IQ4_XS", 1),
        ("tiny-Q4_K_M.gguf", "Q4_K_M", 1),
        ("tiny-UD-Q5_K_XL.gguf", "UD-Q5_K_XL", 1),
        ("tiny-q8_0.gguf", "Q8_0", 1),
    ]  # no projector; the split file's size is both parts'
    assert files[0].size == LISTING[files[0].parts[0]] + LISTING[files[0].parts[1]]
    incomplete = {k: v for k, v in LISTING.items() if "00002-of" not in k}
    assert "Q6_K" not in [f.quant for f in gguf_files(incomplete)]
    assert (
        find(gguf_files({"b-Q8_0.gguf": 1, "a-F16.gguf": 1}), GgufRef("x/y")).path == "a-F16.gguf"
    )
    assert [
        quant_of(n)
        for n in (
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "qwen2.5-0.5b-instruct-q4_k_m.gguf",
            "qwen2.5-0.5b-instruct-fp16.gguf",
            "m.gguf",
        )
    ] == ["Q4_1", "Q4_K_M", "FP16", None]


@pytest.mark.parametrize(
    "spec,label,path,fetched",
    [
        (f"{REPO}:q8_0", f"{REPO}:Q8_0", "tiny-q8_0.gguf", ["tiny-q8_0.gguf"]),
        (REPO, f"{REPO}:Q4_K_M", "tiny-Q4_K_M.gguf", ["tiny-Q4_K_M.gguf"]),
        (
            f"{REPO}:Q6_K",
            f"{REPO}:Q6_K",
            "Q6_K/tiny-Q6_K-00001-of-00002.gguf",
            ["Q6_K/tiny-Q6_K-00001-of-00002.gguf", "Q6_K/tiny-Q6_K-00002-of-00002.gguf"],
        ),
        (
            f"{REPO}/tiny-UD-Q5_K_XL.gguf",
            f"{REPO}/tiny-UD-Q5_K_XL.gguf",
            "tiny-UD-Q5_K_XL.gguf",
            ["tiny-UD-Q5_K_XL.gguf"],
        ),
    ],
)
def test_pull_downloads_exactly_the_file_asked_for(hub, tiny_gguf, spec, label, path, fetched):
    result = invoke("pull", spec)
    assert result.exit_code == 0, result.output
    out = Path(result.stdout.strip())
    assert out.name == Path(path).name and out.read_bytes() == tiny_gguf + path.encode()
    assert downloaded(hub) == fetched
    n = len(fetched)
    assert result.stderr.startswith(
        f"msa: pulling {label} from {hub.url}: {n} file{'s' if n > 1 else ''}, "
    )
    from msa.models.registry import resolve

    assert resolve(spec).path == out  # --model finds it in the hub cache


@pytest.mark.parametrize(
    "spec,message,asks_hub",
    [
        (
            f"{REPO}:Q5_0",
            f"cannot pull {REPO}:Q5_0: the repository has no Q5_0 GGUF (it has Q6_K, F16, "
            "IQ4_XS, Q4_K_M, UD-Q5_K_XL, Q8_0)",
            True,
        ),
        (
            f"{REPO}:iq4_xs",
            f"cannot pull {REPO}:IQ4_XS: msa cannot compute IQ4_XS weights; it computes GGUF "
            "files of type F32, F16, BF16, Q4_0, Q4_1, Q4_K_S, Q4_K_M, Q5_0, Q5_1, Q5_K_S, "
            "Q5_K_M, Q6_K, Q8_0 (and their _L/_XL variants)",
            False,
        ),
        (
            f"{REPO}/tiny-Q2_K.gguf",
            f"cannot pull {REPO}/tiny-Q2_K.gguf: the repository has no such file (its GGUF "
            "files: Q6_K/tiny-Q6_K-00001-of-00002.gguf, tiny-F16.gguf, tiny-IQ4_XS.gguf, "
            "tiny-Q4_K_M.gguf, tiny-UD-Q5_K_XL.gguf, tiny-q8_0.gguf)",
            True,
        ),
        (
            "acme/missing:Q4_K_M",
            "cannot pull acme/missing: no such repository at ",
            True,
        ),
        (
            "acme/no-gguf:Q4_K_M",
            "cannot pull acme/no-gguf:Q4_K_M: the repository has no GGUF file",
            True,
        ),
        (f"{REPO}:", f"'{REPO}:': after ':' comes a quant type such as Q4_K_M or Q8_0", False),
    ],
)
def test_bad_quants_and_repositories_are_one_line_before_any_download(hub, spec, message, asks_hub):
    result = invoke("pull", spec)
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith(f"msa: error: {message}")
    assert result.stderr.count("\n") == 1 and result.stdout == ""
    assert downloaded(hub) == [] and bool(hub.log) == asks_hub


def test_a_pulled_gguf_answers_offline(tiny_gguf, monkeypatch, tmp_path):
    """The real embedded model's file served beside other quants: only it is downloaded, and
    with the hub gone and HF_HUB_OFFLINE=1, `-m owner/repo:QUANT` answers as the same file
    does from the package."""
    from msa.models.registry import KNOWN_MODELS, packaged_file

    real = packaged_file(KNOWN_MODELS["smollm2-135m"])
    repo = "acme/SmolLM2-135M-Instruct-GGUF"
    fake = FakeHub()
    fake.add(
        repo,
        {
            "SmolLM2-135M-Instruct.F16.gguf": tiny_gguf,
            "SmolLM2-135M-Instruct.Q4_1.gguf": real.read_bytes(),
            "SmolLM2-135M-Instruct.Q8_0.gguf": tiny_gguf,
        },
    )
    with serve_hub(fake) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        pulled = invoke("pull", f"{repo}:Q4_1", "-q")
    assert pulled.exit_code == 0, pulled.output
    assert downloaded(fake) == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert Path(pulled.stdout.strip()).read_bytes() == real.read_bytes()

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    doc = tmp_path / "doc.txt"
    doc.write_text("The lighthouse keeper of Harbor Town is named Bernard Okafor.\n")
    answers = []
    for model in (f"{repo}:q4_1", repo, "smollm2-135m"):
        result = invoke(
            "ask", doc, "Who keeps the lighthouse?", "-m", model, "-n", "8", "--json", "--no-cache"
        )
        assert result.exit_code == 0, result.output
        answers.append(json.loads(result.stdout)["answer"])
    assert answers[0] == answers[1] == answers[2] and answers[0].strip()
    again = invoke("pull", f"{repo}:Q4_1")
    assert again.exit_code == 4 and "HF_HUB_OFFLINE is set" in again.stderr
    missing = invoke("ask", doc, "Who?", "-m", f"{repo}:Q8_0", "--no-cache")
    assert missing.exit_code == 4
    assert missing.stderr == (
        f"msa: error: model {repo}:Q8_0 is not downloaded; run `msa pull {repo}:Q8_0`\n"
    )


@pytest.fixture
def pulled(tiny_gguf, tmp_path, monkeypatch):
    """REPO with a Q4_1 file beside the others; its Q4_1, Q8_0 and split Q6_K files pulled and
    the first two loaded, so msa keeps a converted copy of each (the Q4_1 one with its int4
    layers' kernel copy) and remembers their digests, under tmp_path/cache. Yields the hub (its
    log cleared) and the repository's folder in the hub cache."""
    from test_loaders import tiny_config
    from tiny_checkpoints import random_llama_weights, write_tiny_gguf

    from msa.models import digests
    from msa.models.hub_cache import hub_repo_folder
    from msa.models.loading import load_model

    q4 = tmp_path / "source" / "tiny-Q4_1.gguf"
    q4.parent.mkdir()
    config = tiny_config()
    write_tiny_gguf(q4, config, random_llama_weights(config), qtype="Q4_1")
    fake = FakeHub()
    fake.add(REPO, repo_files(tiny_gguf) | {q4.name: q4.read_bytes()})
    monkeypatch.setattr(digests, "SETTLED_NS", 0)  # files just pulled: remember their digests
    with serve_hub(fake) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        for quant in ("Q4_1", "Q8_0", "Q6_K"):
            assert invoke("pull", f"{REPO}:{quant}", "-q").exit_code == 0
        for quant in ("Q4_1", "Q8_0"):
            load_model(f"{REPO}:{quant}", converted_root=tmp_path / "cache" / "models")
        fake.log.clear()
        yield fake, hub_repo_folder(REPO)


def on_disk(tmp_path: Path) -> set[str]:
    """Every file and link in the hub cache and msa's cache, by path under `tmp_path`."""
    hub_cache = tmp_path / "home" / ".cache" / "huggingface"
    return {
        p.relative_to(tmp_path).as_posix()
        for root in (hub_cache, tmp_path / "cache")
        for p in root.rglob("*")
        if p.is_file() or p.is_symlink()
    }


def made_from(tmp_path: Path, gguf: Path) -> set[str]:
    """What msa keeps made from the pulled file `gguf`: its converted copy's files and its
    remembered digest, by path under `tmp_path`."""
    from msa.models.digests import memo_file

    models = tmp_path / "cache" / "models"
    (copy,) = [
        m.parent
        for m in models.glob("*/meta.json")
        if json.loads(m.read_text())["source"] == str(gguf)
    ]
    files = [*copy.iterdir(), memo_file(models / "digests", gguf)]
    return {p.relative_to(tmp_path).as_posix() for p in files}


def test_models_rm_deletes_the_gguf_pulled_by_that_name_and_what_msa_made_of_it(pulled, tmp_path):
    """`msa models rm owner/repo:QUANT` deletes that file (its link in the snapshot and its
    blob), its converted copy with the kernel copy inside, and its remembered digest; the
    other quants and their copies stay, and pulling it again downloads just it."""
    from msa.models.errors import ModelError
    from msa.models.registry import resolve

    hub, repo = pulled
    (snapshot,) = (repo / "snapshots").iterdir()
    q4, q8 = snapshot / "tiny-Q4_1.gguf", snapshot / "tiny-q8_0.gguf"
    copy = made_from(tmp_path, q4)
    assert any(p.endswith("/int4-kernels.pt") for p in copy) and made_from(tmp_path, q8)
    blob = q4.resolve()
    gone = {q4.relative_to(tmp_path).as_posix(), blob.relative_to(tmp_path).as_posix()} | copy
    before = on_disk(tmp_path)
    assert gone <= before
    copy_folder = tmp_path / next(p for p in copy if p.endswith("/meta.json")).rpartition("/")[0]
    copy_bytes = sum(p.stat().st_size for p in copy_folder.iterdir())
    blob_bytes = len(hub.repos[REPO].files[q4.name])

    result = invoke("models", "rm", f"{REPO}:q4_1", "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"removed {REPO}:q4_1: converted copy, {format_size(copy_bytes)}, {copy_folder}\n"
        f"removed {REPO}:q4_1: hub download, {format_size(blob_bytes)}, {q4}\n"
    )
    assert on_disk(tmp_path) == before - gone and hub.log == []  # the hub is never asked
    assert resolve(f"{REPO}:Q8_0").path == q8 and resolve(f"{REPO}:Q6_K").path.is_file()
    with pytest.raises(ModelError, match=f"model {REPO}:Q4_1 is not downloaded"):
        resolve(f"{REPO}:Q4_1")

    again = invoke("pull", f"{REPO}:Q4_1", "-q")
    assert again.exit_code == 0, again.output
    assert downloaded(hub) == [q4.name] and blob.is_file()
    assert on_disk(tmp_path) == before - copy  # the copy is made again at the next load


def test_a_removal_stopped_halfway_breaks_no_pull_and_owner_repo_removes_the_rest(pulled, tmp_path):
    """A removal stopped after a link went and before its blob did: the file is not found, and
    pulling it again links the blob without downloading it. A split file with a part gone is
    still removed by its name, and `owner/repo` removes the whole repository with msa's copies
    of its files; what is left is a name with nothing to remove."""
    from msa.models.errors import ModelError
    from msa.models.registry import resolve

    hub, repo = pulled
    (snapshot,) = (repo / "snapshots").iterdir()
    q8 = snapshot / "tiny-q8_0.gguf"
    blob = q8.resolve()
    q8.unlink()  # as `msa models rm` leaves it when stopped between the link and the blob
    with pytest.raises(ModelError, match="is not downloaded"):
        resolve(f"{REPO}:Q8_0")
    assert invoke("pull", f"{REPO}:Q8_0", "-q").exit_code == 0
    assert downloaded(hub) == [] and q8.resolve() == blob and resolve(f"{REPO}:Q8_0").path == q8

    first, second = sorted((snapshot / "Q6_K").iterdir())
    second_blob = second.resolve()
    first.unlink()  # one part gone, as an interrupted pull or removal leaves it
    split = invoke("models", "rm", f"{REPO}:Q6_K", "--cache-dir", tmp_path / "cache")
    assert split.exit_code == 0, split.output
    assert (
        split.stdout.startswith(f"removed {REPO}:Q6_K: hub download, ")
        and f"{second}\n" in split.stdout
    )
    assert not second_blob.exists() and not (snapshot / "Q6_K").exists()  # its folder too

    cache = tmp_path / "cache"
    derived = made_from(tmp_path, q8) | made_from(tmp_path, snapshot / "tiny-Q4_1.gguf")
    whole = invoke("models", "rm", REPO, "--cache-dir", cache)
    assert whole.exit_code == 0, whole.output
    assert whole.stdout.count(": converted copy, ") == 2
    assert whole.stdout.splitlines()[-1].startswith(f"removed {REPO}: hub download, ")
    hub_root = repo.parent
    assert not repo.exists() and not (hub_root / ".locks" / repo.name).exists()
    assert not [p for p in hub_root.iterdir() if p.name.startswith(".msa-removing")]
    assert not derived & on_disk(tmp_path)
    assert on_disk(tmp_path) == {"home/.cache/huggingface/hub/CACHEDIR.TAG"}  # the hub's own
    after = invoke("models", "rm", f"{REPO}:Q4_1", "--cache-dir", cache)
    assert after.exit_code == 4
    assert after.stderr == (
        f"msa: error: model {REPO}:Q4_1 is not installed: nothing pulled or converted to remove\n"
    )


def test_the_last_file_of_a_repository_takes_its_folder_along(pulled, tmp_path):
    """Removing each pulled file by a name `msa pull` takes (owner/repo/file.gguf, any part of a
    split one, hf.co/owner/repo:QUANT) leaves the repository's folder with nothing: it goes."""
    hub, repo = pulled
    hub_root = repo.parent
    for name in (
        f"{REPO}/Q6_K/tiny-Q6_K-00002-of-00002.gguf",
        f"hf.co/{REPO}:Q8_0",
        f"{REPO}/tiny-Q4_1.gguf",
    ):
        result = invoke("models", "rm", name, "--cache-dir", tmp_path / "cache")
        assert result.exit_code == 0, (name, result.output)
        assert result.stdout.splitlines()[-1].startswith(f"removed {name}: hub download, ")
        assert repo.exists() == (name != f"{REPO}/tiny-Q4_1.gguf")
    assert on_disk(tmp_path) == {"home/.cache/huggingface/hub/CACHEDIR.TAG"}  # the hub's own
    assert not (hub_root / ".locks" / repo.name).exists()
    assert not [p for p in hub_root.iterdir() if p.name.startswith(".msa-removing")]


@pytest.mark.parametrize(
    "name,message",
    [
        (
            f"{REPO}:Q5_0",
            f"model {REPO}:Q5_0 is not installed: nothing pulled or converted to remove; "
            f"pulled from {REPO}: Q6_K, Q4_1, Q8_0",
        ),
        (
            "acme/never-pulled:Q4_K_M",
            "model acme/never-pulled:Q4_K_M is not installed: nothing pulled or converted to "
            "remove",
        ),
        (f"{REPO}/tiny-F16.gguf", f"model {REPO}/tiny-F16.gguf is not installed: "),
        (f"{REPO}:", f"'{REPO}:': after ':' comes a quant type such as Q4_K_M or Q8_0"),
    ],
)
def test_models_rm_of_a_gguf_not_pulled_is_one_line_and_exit_4(pulled, tmp_path, name, message):
    hub, _ = pulled
    before = on_disk(tmp_path)
    result = invoke("models", "rm", name, "--cache-dir", tmp_path / "cache")
    assert result.exit_code == 4, result.output
    assert result.stderr.startswith(f"msa: error: {message}") and result.stderr.count("\n") == 1
    assert result.stdout == "" and on_disk(tmp_path) == before and hub.log == []
