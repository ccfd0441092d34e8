"""The wheel `pip install msa` gets holds every file the package reads at run time: the C++
kernels' sources and the headers they include (built on the user's machine at first load), the
eval's shipped book, and the licence. Built here from this checkout, offline, and compared with
git's files."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the import name each top-level folder is installed under (pyproject.toml's package-dir)
INSTALLED_AS = {"msa_cli": "msa", "models": "msa/models", "kernels": "msa/kernels"}
# written for readers of the repository, not read by the package
REPOSITORY_ONLY = {"kernels/README.md"}
# MD5 of apache.org's LICENSE-2.0.txt, the licence's standard text, as every project copies it
APACHE_2_MD5 = "3b83ef96387f14655fc854ddc3c6bd57"


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_the_wheel_holds_every_file_of_the_package(tmp_path):
    pytest.importorskip("setuptools")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    # built from a copy of the checkout's files as they are now, so that no build/ folder left
    # by an earlier build adds what the package's settings would leave out
    source, out = tmp_path / "source", tmp_path / "wheel"
    package = [p for p in _tracked(*INSTALLED_AS) if p not in REPOSITORY_ONLY]
    for path in package + ["pyproject.toml", "README.md", "LICENSE"]:
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / path, source / path)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = out.glob("msa-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        INSTALLED_AS[top] + "/" + rest for top, _, rest in (p.partition("/") for p in package)
    }
    assert any(name.endswith(".h") for name in expected)  # the headers are among them
    assert sorted(expected - shipped) == []
    # setuptools puts LICEN[CS]E* files into the wheel's metadata, where pip keeps them
    name, version = wheel.name.split("-")[:2]
    assert f"{name}-{version}.dist-info/licenses/LICENSE" in shipped


def test_the_licence_is_the_one_pyproject_names():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == {"text": "Apache-2.0"}
    text = (ROOT / "LICENSE").read_bytes()
    header = [line.strip() for line in text.decode().splitlines()[:4]]
    assert header[1:] == [
        "Apache License",
        "Version 2.0, January 2004",
        "http://www.apache.org/licenses/",
    ]
    assert hashlib.md5(text, usedforsecurity=False).hexdigest() == APACHE_2_MD5
