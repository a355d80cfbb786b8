"""Slides and the static site: the slide rules, every lecture tagged by them, offline pages."""

from __future__ import annotations

import base64
import hashlib
import io
import re
import struct
import tarfile
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_tools.publish import assets, site, slides
from course_tools.publish import slide_layout as layout

ROOT = Path(__file__).resolve().parents[2]
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def _png(width: int, height: int) -> str:
    """A PNG's signature and header (all the slide rules read of a figure), base64."""
    head = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return base64.b64encode(head + b"\x08\x06\x00\x00\x00").decode()


FIGURE = new_output("display_data", data={"image/png": _png(800, 400), "text/plain": "<Figure>"})


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


def _printed(lines: int) -> dict:
    return new_output("stream", name="stdout", text="".join(f"line {i}\n" for i in range(lines)))


def test_long_code_shows_only_its_output_and_long_output_continues_on_the_next_slides():
    long_source = "\n".join(f"x{i} = {i}" for i in range(layout.CODE_LINES + 1))
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title"),
            new_code_cell("import torch"),
            new_code_cell(long_source),  # no output: nothing to show
            new_code_cell(long_source, outputs=[_printed(3)]),
            new_code_cell("print(table)", outputs=[_printed(100)]),
        ]
    )
    assert slides.slide_types(nb) == ["slide", "skip", "skip", "-", "subslide"]
    shown = slides.for_slides(nb)
    kinds = [c.metadata["slideshow"]["slide_type"] for c in shown.cells]
    assert kinds == ["slide", "skip", "skip", "-", "subslide", "subslide", "subslide", "subslide"]
    assert shown.cells[3].metadata["transient"] == {"remove_source": True}
    assert "transient" not in shown.cells[4].metadata  # a short source stays on the slide
    cut = layout.part(nb.cells[4]).output_lines
    assert cut is not None and cut >= layout.OUTPUT_LINES
    printed = shown.cells[4].outputs[0].text.splitlines()
    assert printed[:cut] == [f"line {i}" for i in range(cut)]
    assert printed[cut:] == [f"⋯ {100 - cut} more lines on the next slide"]
    rest = [c.outputs[0].text.splitlines() for c in shown.cells[5:]]
    assert all(page[0] == slides.CONTINUED for page in rest)  # each says what it continues
    lines = [ln for page in rest for ln in page[1:]]
    assert lines == [f"line {i}" for i in range(cut, 100)]  # every line once, in order
    for c in shown.cells[5:]:
        assert c.metadata["transient"] == {"remove_source": True}
        assert len(c.outputs[0].text.splitlines()) <= layout.CONTINUED_LINES
        assert layout.part(c).px <= layout.SLIDE_PX
    assert nb.cells[4].outputs[0].text.count("\n") == 100  # the notebook keeps everything


def test_a_source_that_fits_with_its_output_is_shown_and_no_text_is_cut_by_one_line():
    source = "\n".join(f"x{i} = {i}" for i in range(20))  # a definition a slide introduces
    nb = new_notebook(cells=[new_code_cell(source, outputs=[_printed(3)])])
    assert not layout.part(nb.cells[0]).hide_input
    for lines in range(1, 60):
        cell = new_code_cell("print(x)", outputs=[_printed(lines)])
        part = layout.part(cell)
        assert part.px <= layout.SLIDE_PX
        # a cut leaves out two lines or more: a marker never stands in for a single line
        assert part.output_lines is None or lines - part.output_lines >= 2


def test_long_markdown_continues_on_the_next_slides_and_no_word_is_left_to_the_notes():
    paragraphs = [f"Paragraph {i}: " + " ".join(["words"] * 60) for i in range(12)]
    nb = new_notebook(
        cells=[
            new_markdown_cell("\n\n".join(paragraphs)),
            new_code_cell("import torch"),
            new_code_cell("x", outputs=[_printed(2)]),
        ]
    )
    shown = slides.for_slides(nb).cells
    kinds = [c.metadata["slideshow"]["slide_type"] for c in shown]
    assert kinds[0] == "slide" and len(kinds) > 4 and set(kinds[1:-2]) == {"subslide"}
    assert kinds[-2:] == ["skip", "-"]
    pages = [layout.markdown_blocks(c.source) for c in shown[:-2]]
    assert [b for page in pages for b in page] == paragraphs  # every paragraph, in order
    assert all(page and layout.part(c).px <= layout.SLIDE_PX for page, c in zip(pages, shown))
    # the code after the cell joins its last page, the height the rules count for the cell
    assert layout.part(nb.cells[0]).px == layout.part(shown[-3]).px


def _kinds(cells) -> list[str]:
    return [c.metadata["slideshow"]["slide_type"] for c in cells]


def test_a_section_starts_a_slide_and_a_tall_list_continues_item_by_item():
    items = [f"{i}. Item {i}: " + " ".join(["words"] * 50) for i in range(1, 13)]
    source = "\n\n".join(["Intro.", "## 9. A section", "\n".join(items), "## 10. Next", "Last."])
    pages = layout.markdown_pages(source)
    assert pages[0] == "Intro."  # a section never starts at the foot of a slide
    assert pages[1].startswith("## 9. A section\n\n1. Item 1:")
    assert pages[-1] == "## 10. Next\n\nLast."
    listed = [line for page in pages for line in page.splitlines() if line[:1].isdigit()]
    assert listed == items  # every item, each once, in order
    for page in pages[1:]:
        lines = [ln for ln in page.splitlines() if ln[:1].isdigit()]
        if lines:  # a list's items on one slide stay one tight list
            assert "\n".join(lines) in page
    assert all(layout.part(new_markdown_cell(p)).px <= layout.SLIDE_PX for p in pages)
    shown = slides.for_slides(new_notebook(cells=[new_markdown_cell(source)])).cells
    assert [c.source for c in shown] == pages
    opens = [c.source.startswith("## ") for c in shown]
    assert _kinds(shown) == ["slide"] + ["slide" if o else "subslide" for o in opens[1:]]


def test_a_heading_moves_on_with_its_block_or_keeps_the_first_items_of_its_list():
    most = "Intro: " + " ".join(["words"] * 300)  # most of a slide
    assert layout.markdown_pages(f"{most}\n\n### Sub\n\nA paragraph.") == [
        most,
        "### Sub\n\nA paragraph.",
    ]
    # a list that fits a slide alone but not under its heading: the heading keeps its first items
    items = [f"- Item {i}: " + " ".join(["words"] * 45) for i in range(5)]
    source = "## Head\n\n" + "\n".join(items)
    assert layout.part(new_markdown_cell("\n".join(items))).px <= layout.SLIDE_PX
    assert layout.part(new_markdown_cell(source)).pages, "the case needs two slides"
    first, *rest = layout.markdown_pages(source)
    assert first.startswith("## Head\n\n- Item 0:") and "- Item 1:" in first
    assert [ln for page in (first, *rest) for ln in page.splitlines() if ln[:1] == "-"] == items
    # a lead-in paragraph (ending with a colon) is not left behind at the foot of a slide
    lead, some = "In this unit you will:", "Intro: " + " ".join(["words"] * 250)
    assert layout.part(new_markdown_cell(f"{some}\n\n{lead}")).px <= layout.SLIDE_PX
    first, second = layout.markdown_pages(f"{some}\n\n{lead}\n\n" + "\n".join(items[:3]))
    assert first == some and second.startswith(lead + "\n\n- Item 0:")


def test_an_items_nested_code_block_stays_with_its_item():
    source = "- Run it:\n\n   ```\n   python -m x\n   python -m y\n   ```\n- Next item."
    assert layout.markdown_blocks(source) == [source]
    one_line = layout.part(new_markdown_cell("- Run it: python -m x python -m y\n- Next item."))
    assert layout.part(new_markdown_cell(source)).px > one_line.px  # the code's lines count
    most = "Intro: " + " ".join(["words"] * 330)
    pages = layout.markdown_pages(f"{most}\n\n{source}")
    assert pages == [most, source]


def test_text_before_a_section_joins_the_slide_above_and_a_last_heading_stands_alone():
    tall = new_output("display_data", data={"image/png": _png(1000, 560)})
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title"),
            new_code_cell("import torch"),
            new_markdown_cell("A short idea."),
            new_markdown_cell("Closing words.\n\n## 2. Next section"),
            new_code_cell("plot()", outputs=[tall]),
            new_markdown_cell("More text.\n\n### 2.1 A subsection"),
            new_code_cell("plot()", outputs=[tall]),
        ]
    )
    assert slides.slide_types(nb) == [
        "slide", "skip", "subslide", "slide", "subslide", "subslide", "subslide"
    ]  # fmt: skip
    shown = slides.for_slides(nb).cells
    assert [
        (c.source, kind) for c, kind in zip(shown, _kinds(shown)) if c.cell_type == "markdown"
    ] == [
        ("# Title", "slide"),
        ("A short idea.", "subslide"),
        ("Closing words.", "-"),  # ends the section above, under its last slide's text
        ("## 2. Next section", "slide"),  # opens its section: a title slide before the figure
        ("More text.", "subslide"),
        ("### 2.1 A subsection", "subslide"),  # not at the foot of the text before it
    ]


def test_every_word_of_every_lecture_reaches_a_slide():
    """The defect this guards: the text of a markdown cell taller than a slide went to the speaker
    notes, and five decks ended without their takeaways on screen."""
    for path in LECTURES:
        nb = nbformat.read(path, as_version=4)
        shown = slides.for_slides(nb).cells
        text = [
            c.source
            for c in shown
            if c.cell_type == "markdown"
            and c.metadata["slideshow"]["slide_type"] not in ("skip", "notes")
        ]
        kept = [
            c.source
            for c, kind in zip(nb.cells, slides.slide_types(nb))
            if c.cell_type == "markdown" and kind not in ("skip", "notes")
        ]
        words = " ".join(kept).split()
        assert " ".join(text).split() == words, path.name


def test_a_cell_that_does_not_fit_under_the_text_starts_a_subslide_and_figures_give_way():
    text = new_markdown_cell("\n\n".join("A paragraph of text. " * 4 for _ in range(8)))
    tall = new_output("display_data", data={"image/png": _png(1000, 560)})
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title"),
            new_code_cell("import torch"),
            text,
            new_code_cell("plot()", outputs=[FIGURE]),
            new_code_cell("plot(); print(table)", outputs=[_printed(8), tall]),
        ]
    )
    assert slides.slide_types(nb) == ["slide", "skip", "subslide", "subslide", "subslide"]
    printed, figure = slides.for_slides(nb).cells[4].outputs
    assert figure.metadata["image/png"]["width"] < 1000  # narrower, so the printed lines fit
    assert printed.text.count("\n") == 8  # all of them
    assert layout.part(nb.cells[4]).px <= layout.SLIDE_PX


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
        f"`python -m course_tools.publish tag {path.relative_to(ROOT)}` (make notebooks does it)"
    )
    n = slides.count_slides(nb)
    assert 10 <= n <= 60, f"{path.name} has {n} slides; a lecture should have about 15-50"


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
    lectures = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [r["unit"] for r in rows] == lectures  # one row per lecture, in order


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
    assert 'href="references.html"' in page
    # README's code spans are code on the page, never literal backticks (issue 26 item 9)
    assert "`" not in page and "<code>course_lib.plan</code>" in page


def _nav(page: str) -> str:
    match = re.search(r'<nav class="course-nav">(.*?)</nav>', page, re.S)
    assert match, "no navigation bar"
    return match.group(1)


def test_site_pages_are_titled_and_linked(tmp_path, monkeypatch):
    monkeypatch.setattr(
        assets,
        "install",
        lambda dest: {k: f"{k}.js" for k in ("reveal", "require", "jquery", "mathjax", "widgets")},
    )
    monkeypatch.setattr(slides, "export", lambda path, out, urls: out / f"{path.stem}.slides.html")
    site.build(tmp_path, units=["00", "01"])
    stems = [p.stem for p in LECTURES]
    for folder in ("lectures", "exercises"):
        first = (tmp_path / folder / "00_start_here.html").read_text(encoding="utf-8")
        second = (tmp_path / folder / "01_backprop_memory.html").read_text(encoding="utf-8")
        assert re.search(r"<title>Unit 01 — Backprop memory(: exercises)?</title>", second)
        assert "<title>00_start_here</title>" not in first
        nav0, nav1 = _nav(first), _nav(second)
        assert 'href="../index.html"' in nav0 and 'href="../index.html"' in nav1
        assert 'rel="prev"' not in nav0
        assert f'href="{stems[1]}.html" rel="next"' in nav0
        assert f'href="{stems[0]}.html" rel="prev"' in nav1
        assert f'href="{stems[2]}.html" rel="next"' in nav1
        assert '.ipynb"' not in nav0 + nav1
    lecture = (tmp_path / "lectures" / "00_start_here.html").read_text(encoding="utf-8")
    assert 'href="../exercises/00_start_here.html"' in lecture
    assert 'href="01_backprop_memory.html"' in lecture
    references = (tmp_path / "references.html").read_text(encoding="utf-8")
    anchors = set(re.findall(r'<h\d id="([^"]+)"', references))
    cited = re.findall(r'href="\.\./references\.html#([^"]+)"', lecture)
    assert cited and set(cited) <= anchors


def test_site_refuses_unknown_units(tmp_path):
    with pytest.raises(ValueError, match=r"units = \['77'\] not found; valid: 00"):
        site.build(tmp_path, units=["77"])


def test_the_site_never_publishes_answers_written_into_the_working_copy(tmp_path, monkeypatch):
    # A learner (or an instructor trying the exercises) fills in exercises/ in their clone: the
    # site is built from the generator's output, so nothing written there reaches a page.
    monkeypatch.setattr(
        assets,
        "install",
        lambda dest: {k: f"{k}.js" for k in ("reveal", "require", "jquery", "mathjax", "widgets")},
    )
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("notebooks", "solutions", "README.md"):
        (repo / name).symlink_to(ROOT / name)
    (repo / "exercises").mkdir()
    working = nbformat.read(ROOT / "exercises" / "05_cpu_offload.ipynb", as_version=4)
    for cell in working.cells:
        if cell.cell_type == "code" and "FILL ME IN" in cell.source:
            cell.source = "# MY-ANSWER-7f3a\n" + cell.source.replace(
                "raise NotImplementedError", "pass  #"
            )
            cell.outputs = [
                nbformat.v4.new_output("stream", name="stdout", text="MY-OUTPUT-7f3a\n")
            ]
    nbformat.write(working, repo / "exercises" / "05_cpu_offload.ipynb")
    monkeypatch.setattr(site, "ROOT", repo)
    site.build(tmp_path / "site", units=["05"])
    published = tmp_path / "site" / "exercises"
    for page in (published / "05_cpu_offload.html", published / "05_cpu_offload.ipynb"):
        text = page.read_text(encoding="utf-8")
        assert "MY-ANSWER-7f3a" not in text and "MY-OUTPUT-7f3a" not in text
        assert "FILL ME IN" in text
    # the downloadable notebook is exactly what `make exercises` generates
    assert (published / "05_cpu_offload.ipynb").read_bytes() == (
        ROOT / "exercises" / "05_cpu_offload.ipynb"
    ).read_bytes()


def test_a_lead_in_moves_onto_the_slide_of_the_code_it_introduces():
    assert layout.leads("**Backends.** `torch.distributed` sends the bytes through a *backend*:")
    assert layout.leads("`estimate` predicts, for each layout:") and layout.leads("## 2. Next")
    assert not layout.leads("* an item:") and not layout.leads("| a | b |")
    assert not layout.leads("A sentence that ends.")
    text = "Intro: " + " ".join(["words"] * 200)  # about half a slide
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title"),
            new_code_cell("import torch"),
            new_markdown_cell(f"{text}\n\nWhich ones this build has:"),
            new_code_cell("report()", outputs=[_printed(20)]),  # too tall under the text
        ]
    )
    assert slides.slide_types(nb)[2:] == ["subslide", "subslide"]
    shown = slides.for_slides(nb).cells
    assert [(c.source, k) for c, k in zip(shown, _kinds(shown))][2:] == [
        (text, "subslide"),
        ("Which ones this build has:", "subslide"),  # not at the foot of the slide before
        ("report()", "-"),  # under the lead-in that announces it
    ]
