"""Slides and the static site: the slide rules, every lecture tagged by them, offline pages."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import tarfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_lib.publish import assets, site, slides

ROOT = Path(__file__).resolve().parents[2]
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FIGURE = new_output("display_data", data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"})


def _notebook():
    return new_notebook(
        cells=[
            new_markdown_cell("# Unit 99 — title"),
            new_code_cell("import torch"),
            new_markdown_cell("## 1. A section"),
            new_code_cell("plot()", outputs=[FIGURE]),
            new_code_cell("plot_again()", outputs=[FIGURE]),
            new_markdown_cell("An idea in a paragraph."),
            new_code_cell("x = 1"),
            new_markdown_cell("Text before a heading.\n\n## 2. Next section"),
            new_markdown_cell("Hidden aside.", metadata={"tags": ["slide:skip"]}),
        ]
    )


def test_slide_rules():
    assert slides.slide_types(_notebook()) == [
        "slide",
        "skip",
        "slide",
        "-",
        "subslide",
        "subslide",
        "-",
        "slide",
        "skip",
    ]


def test_bad_override_tag_names_the_valid_types():
    nb = new_notebook(cells=[new_markdown_cell("x", metadata={"tags": ["slide:page"]})])
    with pytest.raises(ValueError, match=r"'page' is not one of slide, subslide, fragment"):
        slides.slide_types(nb)


def test_tag_writes_metadata_once(tmp_path):
    path = tmp_path / "nb.ipynb"
    nbformat.write(_notebook(), path)
    assert slides.tag(path) is True
    assert slides.tag(path) is False
    nb = nbformat.read(path, as_version=4)
    assert slides.count_slides(nb) == 5


@pytest.mark.parametrize("path", LECTURES, ids=[p.stem for p in LECTURES])
def test_every_lecture_is_tagged_by_the_rules(path):
    nb = nbformat.read(path, as_version=4)
    stored = [c.metadata.get("slideshow", {}).get("slide_type") for c in nb.cells]
    assert stored == slides.slide_types(nb), (
        f"{path.name}: slide metadata differs from the rules; run "
        f"`python -m course_lib.publish tag {path.relative_to(ROOT)}` (make notebooks does it)"
    )
    n = slides.count_slides(nb)
    assert 10 <= n <= 36, f"{path.name} has {n} slides; a lecture should have about 15-30"


def test_slides_reference_only_local_files(tmp_path):
    urls = {
        "reveal": "./vendor/reveal",
        "require": "./vendor/require.js",
        "jquery": "./vendor/jquery.js",
        "mathjax": "./vendor/MathJax.js",
        "widgets": "./vendor/embed-amd.js",
    }
    lecture = ROOT / "notebooks" / "00_start_here.ipynb"
    tagged = tmp_path / lecture.name
    nbformat.write(nbformat.read(lecture, as_version=4), tagged)
    slides.tag(tagged)
    out = slides.export(tagged, tmp_path, urls)
    page = out.read_text(encoding="utf-8")
    external = re.findall(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"', page)
    assert external == []
    assert "mermaid" not in page
    assert "./vendor/reveal/dist/reveal.js" in page
    n_slides = len(re.findall(r"<section\b", page)) - page.count("<section>\n<section")
    assert n_slides >= slides.count_slides(nbformat.read(tagged, as_version=4))


def _fake_asset(tmp_path, monkeypatch, files: dict[str, bytes]):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    asset = assets.Asset("fake", "1.0.0", integrity, keep=("dist/",), drop=(".map",))
    monkeypatch.setenv("COURSE_VENDOR_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / f"{asset.dirname}.tgz").write_bytes(data)
    monkeypatch.setitem(assets.ASSETS, "fake", asset)
    return asset


def test_unpack_keeps_only_what_pages_load(tmp_path, monkeypatch):
    _fake_asset(tmp_path, monkeypatch, {"dist/a.js": b"a", "dist/a.js.map": b"m", "src/b.js": b"b"})
    folder = assets.unpack("fake", tmp_path / "out")
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert files == [".complete", "dist/a.js"]


def test_a_corrupted_tarball_is_refused(tmp_path, monkeypatch):
    asset = _fake_asset(tmp_path, monkeypatch, {"dist/a.js": b"a"})
    cached = tmp_path / "cache" / f"{asset.dirname}.tgz"
    cached.write_bytes(cached.read_bytes()[:-5])
    with pytest.raises(assets.AssetError, match="a corrupted or different download"):
        assets.unpack("fake", tmp_path / "out")


def test_unknown_asset_names_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match=r"asset = 'x' is not known; valid: reveal, require"):
        assets.unpack("x", tmp_path)


def test_course_map_has_every_unit():
    rows = site.course_map()
    assert [r["unit"] for r in rows] == [f"{i:02d}" for i in range(17)]


def test_site_index_links_built_units(tmp_path, monkeypatch):
    monkeypatch.setattr(
        assets,
        "install",
        lambda dest: {k: f"{k}.js" for k in ("reveal", "require", "jquery", "mathjax", "widgets")},
    )
    index = site.build(tmp_path, units=["00"])
    page = index.read_text(encoding="utf-8")
    assert 'href="lectures/00_start_here.html"' in page
    assert 'href="slides/00_start_here.slides.html"' in page
    assert 'href="exercises/00_start_here.ipynb"' in page
    for folder in ("lectures", "slides", "exercises"):
        assert (tmp_path / folder / "00_start_here.html").exists() or folder == "slides"
    assert (tmp_path / "slides" / "00_start_here.slides.html").exists()
    lecture = (tmp_path / "lectures" / "00_start_here.html").read_text(encoding="utf-8")
    assert 'src="../vendor/require.js"' in lecture


def test_site_refuses_unknown_units(tmp_path):
    with pytest.raises(ValueError, match=r"units = \['77'\] not found; valid: 00"):
        site.build(tmp_path, units=["77"])
