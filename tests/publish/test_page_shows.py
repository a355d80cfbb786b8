"""What the static site and slides show (issue 52): each "Explore" widget's picture at its
default settings in place of its dead controls, a lead-in on the slide of what it introduces,
printed text that keeps its lines, a code block that scrolls saying so."""

from __future__ import annotations

import base64
import re
import struct
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_tools.publish import site, slides, snapshots
from course_tools.publish import slide_layout as layout

ROOT = Path(__file__).resolve().parents[2]
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
URLS = {
    "reveal": "./vendor/reveal",
    "require": "./vendor/require.js",
    "jquery": "./vendor/jquery.js",
    "mathjax": "./vendor/MathJax.js",
    "widgets": "./vendor/embed-amd.js",
}
VIEW = "application/vnd.jupyter.widget-view+json"


def _png(width: int, height: int) -> str:
    head = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + struct.pack(">II", width, height)
    return base64.b64encode(head + b"\x08\x06\x00\x00\x00").decode()


def _view(model_id: str = "abc") -> dict:
    data = {VIEW: {"version_major": 2, "version_minor": 0, "model_id": model_id}, "text/plain": "w"}
    return new_output("display_data", data=data)


SNAPSHOT = new_output(
    "display_data",
    data={
        "text/html": '<div class="course-snapshot"><p><em>The live version runs in JupyterLab.'
        "</em></p><p>status</p></div>",
        "text/plain": "The live version runs in JupyterLab.\nstatus",
    },
)
FIGURE = new_output("display_data", data={"image/png": _png(800, 400), "text/plain": "<Figure>"})


def test_the_snapshot_class_is_the_one_the_explorer_writes():
    from course_lib.viz import widgets

    assert snapshots.SNAPSHOT_CLASS == widgets.SNAPSHOT_CLASS


def test_a_static_page_shows_a_widgets_snapshot_in_its_place_and_keeps_other_widgets():
    printed = new_output("stream", name="stdout", text="done\n")
    nb = new_notebook(
        cells=[
            new_code_cell("explorer", outputs=[_view(), SNAPSHOT, FIGURE]),
            new_code_cell("for _ in tqdm(x): pass", outputs=[_view("bar"), printed]),
        ]
    )
    static = snapshots.static(nb)
    assert static.cells[0].outputs == [SNAPSHOT, FIGURE]
    assert static.cells[1].outputs == nb.cells[1].outputs  # a progress bar: no snapshot
    assert nb.cells[0].outputs[0] == _view()  # the notebook itself is left as it was


def _explore_cells(nb) -> list:
    """The code cells that show an explorer: a stored widget view, "Explorer(" or "explorer"."""
    return [
        cell
        for cell in nb.cells
        if cell.cell_type == "code"
        and any(VIEW in out.get("data", {}) for out in cell.get("outputs", []))
        and re.search(r"Explorer\(|^explorer(\.widget)?$", cell.source, re.M)
    ]


WITH_EXPLORERS = [p for p in LECTURES if _explore_cells(nbformat.read(p, as_version=4))]


def test_the_lectures_have_explorers():
    assert len(WITH_EXPLORERS) >= 17, [p.name for p in WITH_EXPLORERS]


@pytest.mark.parametrize("path", WITH_EXPLORERS, ids=[p.stem for p in WITH_EXPLORERS])
def test_every_explore_cell_shows_its_picture_on_the_site_and_the_slides(path, tmp_path):
    """Issue 52 item 2: on a page or a slide (no kernel) an explorer showed dead controls and
    "Run this cell". Each Explore cell of the stored lecture must show a picture (its default
    run, stored as the snapshot) and the line saying that the live version runs in JupyterLab,
    and no widget view. Exported as the site and slides do it, with only the Explore cells."""
    nb = nbformat.read(path, as_version=4)
    cells = _explore_cells(nb)
    page_nb = new_notebook(
        cells=[new_markdown_cell("# Explore"), new_code_cell("import torch"), *cells],
        metadata=nb.metadata,
    )
    source = tmp_path / path.name
    nbformat.write(page_nb, source)
    page = site._export_html(source, tmp_path, URLS).read_text(encoding="utf-8")
    deck = slides.export(source, tmp_path, URLS).read_text(encoding="utf-8")
    for where, html in (("site", page), ("slides", deck)):
        pictures = len(re.findall(r'<img [^>]*src="data:image/png', html))
        assert pictures >= len(cells), (
            f"{path.name} ({where}): {len(cells)} Explore cell(s), "
            f"{pictures} picture(s): re-execute the lecture (make notebooks)"
        )
        assert html.count("runs in JupyterLab") >= len(cells), where
        assert f'<script type="{VIEW}">' not in html, where  # no dead controls


def _slides_of(nb) -> list[list]:
    shown: list[list] = []
    for cell in nb.cells:
        kind = cell.metadata.get("slideshow", {}).get("slide_type")
        if kind in ("skip", "notes"):
            continue
        if kind in ("slide", "subslide") or not shown:
            shown.append([])
        shown[-1].append(cell)
    return shown


def _lead_in_alone(group: list) -> bool:
    return all(c.cell_type == "markdown" for c in group) and group[-1].source.rstrip().endswith(":")


def test_a_lead_in_stays_with_the_output_it_introduces_and_the_rest_follows():
    """Issue 52 item 5: a lead-in ending in ":" whose cell did not fit under it stood alone on
    a slide, the table or figure on the next. The cell now shows under it what fits (its source
    left out, figures smaller), and its other outputs go on the next slide."""
    table = new_output(
        "execute_result",
        data={"text/html": "<table>" + "<tr><td>1</td></tr>" * 12 + "</table>", "text/plain": "t"},
        execution_count=1,
    )
    tall = new_output("display_data", data={"image/png": _png(1100, 500), "text/plain": "<F>"})
    text = " ".join(["words"] * 200)
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title"),
            new_code_cell("import torch"),
            new_markdown_cell(f"{text}\n\nThe table and its figure:"),
            new_code_cell("table = make()\nplot(table)\ntable", outputs=[table, tall]),
        ]
    )
    shown = slides.for_slides(nb)
    groups = _slides_of(shown)
    assert not any(_lead_in_alone(g) for g in groups)
    lead, rest = groups[-2], groups[-1]
    assert [c.cell_type for c in lead] == ["markdown", "code"]
    assert lead[0].source == "The table and its figure:"
    assert lead[1].outputs == [table] and rest[0].outputs[0].data == tall.data
    assert rest[0].metadata["transient"] == {"remove_source": True}
    room = layout.SLIDE_PX - layout.part(new_markdown_cell(lead[0].source)).px
    assert layout.part(lead[1], room).px <= room


def test_no_slide_of_a_lecture_holds_only_a_lead_in():
    """Issue 52 item 5: 28 of 716 slides held only a lead-in ending in ":"."""
    found = []
    for path in LECTURES:
        for group in _slides_of(slides.for_slides(nbformat.read(path, as_version=4))):
            if _lead_in_alone(group):
                found.append(f"{path.stem}: {group[-1].source[-60:]!r}")
    assert found == [], "\n".join(found)


def test_slides_keep_code_inside_its_cell_and_mark_a_block_that_scrolls():
    """Issue 52 item 5: code lines ran under the cell's right edge (a padded pre as wide as its
    cell) with no sign that the block scrolls. Checked in a browser by tests/browser."""
    css = (slides.TEMPLATES / "course_slides" / "static" / "course_slides.css").read_text()
    assert "box-sizing: border-box" in css.split(".reveal div.highlight > pre")[0]
    assert ".course-scrolls" in css
    template = (slides.TEMPLATES / "course_slides" / "index.html.j2").read_text()
    assert 'classList.toggle("course-scrolls"' in template


def test_site_pages_keep_printed_lines_whole():
    """Issue 52 item 4: JupyterLab's style (the site's) wraps printed text anywhere; the site's
    pages let a long line scroll instead. Checked at 1280 x 720 in tests/browser."""
    nb = new_notebook(cells=[new_code_cell("print(x)", outputs=[FIGURE])])
    body, _ = site._html_exporter(tuple(sorted(URLS.items()))).from_notebook_node(nb)
    rule = re.search(r"\.jp-OutputArea-output pre \{([^}]*)\}", body.split("</style>")[-2])
    assert rule and "white-space: pre;" in rule.group(1), "no rule after JupyterLab's own"


def test_lecture_01_prints_its_scale_table_rounded():
    """Issue 52 item 7: lecture 01's 7B/70B table asked for ``.round(1)`` after a transpose that
    had made every column an object column (one holds text), so it printed 106.668687 GB."""
    nb = nbformat.read(ROOT / "notebooks" / "01_backprop_memory.ipynb", as_version=4)
    [cell] = [c for c in nb.cells if c.cell_type == "code" and "pd.DataFrame(rows).T" in c.source]
    [table] = [o for o in cell.outputs if "text/plain" in o.get("data", {})]
    numbers = re.findall(r"\b\d+\.\d+\b", table.data["text/plain"])
    assert numbers and all(len(n.split(".")[1]) == 1 for n in numbers), numbers


def test_a_cell_too_tall_for_a_slide_even_with_small_figures_goes_on_over_the_next():
    """Lecture 04's explorer shows two figures under its status line: drawn at the smallest
    scale they still ran 150 px off the slide; its second figure goes on the next slide."""
    tall = new_output("display_data", data={"image/png": _png(1100, 500), "text/plain": "<F>"})
    nb = new_notebook(
        cells=[
            new_markdown_cell("# Title"),
            new_code_cell("import torch"),
            new_markdown_cell("An idea."),
            new_code_cell("explorer", outputs=[SNAPSHOT, tall, tall]),
        ]
    )
    groups = _slides_of(slides.for_slides(nb))
    assert [len(c.outputs) for c in groups[-2] if c.cell_type == "code"] == [2]
    assert [c.outputs[0].data for c in groups[-1]] == [tall.data]
    for group in groups:
        assert sum(layout.part(c).px for c in group) <= layout.SLIDE_PX
