"""Lectures as slides: the slide metadata of every lecture, and static reveal.js slides.

An instructor presents a lecture live in JupyterLab (``jupyterlab-rise``, installed by
``make lab``: cells run, widgets work) or from the static slides ``make slides`` writes. Both read
the ``slideshow.slide_type`` metadata of each cell, which :func:`tag` sets by the rules below so
that every lecture follows them and an edited lecture is re-tagged by ``make notebooks``:

- a markdown cell with a ``#`` or ``##`` heading starts a **slide** (a section: one column in
  reveal.js);
- any other markdown cell starts a **subslide** (one idea: the text and the code that follows it);
- a code cell belongs to the (sub)slide of the text above it, except that it starts a subslide
  of its own when it does not fit under what is already there (heights from
  :mod:`course_tools.publish.slide_layout`, for a 1280 x 720 screen) or when it shows a figure and
  its subslide already has one; the setup cell (the first code cell: imports and constants) is
  **skipped**, and so is a code cell whose source is too long for a slide and has no output;
- what a slide shows of a tall cell (only the output of a long code cell, the first lines of a
  long printed text with the rest on the slides after it) is decided by the same module when the
  slides are written; the notebook keeps it all;
- the static slides also page a markdown cell (:func:`for_slides`): text too tall for one slide
  continues on the next ones, a ``#`` or ``##`` heading inside a cell opens a slide (the text
  before it ends the section above, under that section's last slide when it fits), and a heading
  never stands at the foot of a slide whose next one holds what it heads. Every word of a
  lecture's text is on a slide;
- a lead-in ("The table:") never ends a slide alone: it opens the slide of the code cell it
  introduces, which shows under it what fits there (its output without its source, printed text
  cut, figures smaller), its other outputs (a figure after a table) on the slide after;
- an "Explore" widget shows as its stored snapshot (:mod:`course_tools.publish.snapshots`);
- a cell tagged ``slide:<type>`` (``slide:skip``, ``slide:subslide``, ``slide:fragment``, ...)
  overrides the rules, for the cases they get wrong.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import nbformat

from course_tools.publish import slide_layout as layout
from course_tools.publish import snapshots

TEMPLATES = Path(__file__).parent / "templates"
#: the screen the slides are made for (reveal.js scales them to the window)
SCREEN = (1280, 720)
SLIDE_TYPES = ("slide", "subslide", "fragment", "-", "skip", "notes")


def _override(cell) -> str | None:
    for tag in cell.metadata.get("tags", []):
        if tag.startswith("slide:"):
            kind = tag.split(":", 1)[1]
            if kind not in SLIDE_TYPES:
                raise ValueError(
                    f"cell tag {tag!r}: slide type {kind!r} is not one of {', '.join(SLIDE_TYPES)}"
                )
            return kind
    return None


def _has_figure(cell) -> bool:
    return any(
        "image/png" in out.get("data", {}) or "image/svg+xml" in out.get("data", {})
        for out in cell.get("outputs", [])
    )


def _rule(cell, index: int, first_code: bool, figures: int, px: int) -> str:
    if cell.cell_type == "markdown":
        text = cell.source.lstrip()
        section = any(line.startswith(("# ", "## ")) for line in text.splitlines())
        return "slide" if index == 0 or section else "subslide"
    if cell.cell_type != "code" or first_code:
        return "skip"
    shown = layout.part(cell)
    if shown.hide_input and not cell.get("outputs"):
        return "skip"
    if px + shown.px > layout.SLIDE_PX or (_has_figure(cell) and figures):
        return "subslide"
    return "-"


def slide_types(nb) -> list[str]:
    """The slide type of each cell of ``nb`` by the rules of this module."""
    kinds: list[str] = []
    first_code = True
    figures = 0  # figures on the current subslide
    px = 0  # estimated height of what the current subslide shows so far
    for index, cell in enumerate(nb.cells):
        kind = _override(cell) or _rule(cell, index, first_code, figures, px)
        if cell.cell_type == "code":
            first_code = False
        if kind in ("slide", "subslide"):
            figures = px = 0
        if kind not in ("skip", "notes"):
            px += layout.part(cell).px
            figures += _has_figure(cell)
        kinds.append(kind)
    return kinds


def _page(text: str) -> nbformat.NotebookNode:
    """The next slide of a markdown cell: a section's slide when it starts one."""
    kind = "slide" if _opens_section(text) else "subslide"
    return nbformat.v4.new_markdown_cell(text, metadata={"slideshow": {"slide_type": kind}})


def _cut_outputs(cell, lines: int) -> list[str]:
    """Cut each printed text of ``cell`` to ``lines`` lines; what each cut left out."""
    rests = []
    for out in cell.get("outputs", []):
        text = layout.printed_text(out)
        if text is None or len(text.rstrip("\n").splitlines()) <= lines + 1:
            continue
        rests.append("\n".join(text.rstrip("\n").splitlines()[lines:]))
        if out.output_type == "stream":
            out.text = layout.cut_text(text, lines)
        elif out.output_type == "error":
            out.traceback = layout.cut_text(text, lines).splitlines()
        else:
            out.data["text/plain"] = layout.cut_text(text, lines)
    return rests


def _continued(rest: str) -> list[nbformat.NotebookNode]:
    """The rest of a cut printed text, on as many slides as it needs after its cell's, each
    under a line saying that it continues the slide before."""
    lines = rest.splitlines()
    per = layout.CONTINUED_LINES - 1
    return [
        nbformat.v4.new_code_cell(
            "",
            outputs=[
                nbformat.v4.new_output(
                    "stream", name="stdout", text="\n".join([CONTINUED, *chunk]) + "\n"
                )
            ],
            metadata={
                "slideshow": {"slide_type": "subslide"},
                "transient": {"remove_source": True},
            },
        )
        for chunk in (lines[k : k + per] for k in range(0, len(lines), per))
    ]


#: the first line of a slide that continues a printed text
CONTINUED = "⋯ continued from the slide before"


def _scale_figures(cell, scale: float) -> None:
    for out in cell.get("outputs", []):
        if "image/png" in out.get("data", {}):
            width = layout.figure_width("".join(out.data["image/png"]), scale)
            if width is not None:
                out.setdefault("metadata", {})["image/png"] = {"width": width}


def for_slides(nb):
    """A copy of ``nb`` as its slides show it: slide types by the rules, and of each tall cell
    what fits (:mod:`course_tools.publish.slide_layout`): a code cell's long printed text cut, the
    rest on slides after it; a markdown cell's text over as many slides as it needs; an "Explore"
    widget's snapshot in place of the widget (:mod:`course_tools.publish.snapshots`)."""
    nb = snapshots.static(nb)  # a copy
    kinds = slide_types(nb)
    rooms: dict[int, int] = {}  # a code cell under a lead-in shows what fits under it
    rests: dict[int, list] = {}  # and the outputs that do not, on the slide after
    cells = []
    px = 0  # estimated height of what the current slide shows so far
    for index, cell in enumerate(nb.cells):
        kind = kinds[index]  # a lead-in below may have joined this cell to the slide before
        cell.metadata["slideshow"] = {"slide_type": kind}
        cells.append(cell)
        if kind in ("skip", "notes"):
            continue
        room = rooms.get(index, layout.SLIDE_PX)
        if cell.cell_type == "code" and index not in rests and layout.part(cell, room).px > room:
            rests[index] = _outputs_beyond(cell, room)  # too tall: last outputs on next slides
        shown = layout.part(cell, room)
        before, px = px, (px if kind in ("-", "fragment") else 0) + shown.px
        if shown.hide_input:
            cell.metadata["transient"] = {"remove_source": True}
        if shown.figure_scale < 1:
            _scale_figures(cell, shown.figure_scale)
        if shown.output_lines is not None:
            cells += [
                page for rest in _cut_outputs(cell, shown.output_lines) for page in _continued(rest)
            ]
        if rests.get(index):
            cells += _rest_of(rests[index])
        if cell.cell_type == "markdown":
            pages = shown.pages or [cell.source]
            after = _next_shown(kinds, index)
            if after is None or kinds[after] in ("slide", "subslide"):
                code = nb.cells[after] if after is not None and kinds[after] == "subslide" else None
                pages, room = _lead_onto_next_slide(pages, code)
                if room is not None and after is not None:
                    kinds[after], rooms[after] = "-", room
                    if code is not None and (rest := _outputs_beyond(code, room)):
                        rests[after] = rest
            if len(pages) > 1:
                cell.source = pages[0]
                if kind == "slide" and index > 0 and not _opens_section(pages[0]):
                    # the text before the section's heading ends the section before: under
                    # the last slide's content if it fits there, else on a slide of its own
                    first = layout.part(nbformat.v4.new_markdown_cell(pages[0])).px
                    joins = before + first <= layout.SLIDE_PX
                    cell.metadata["slideshow"] = {"slide_type": "-" if joins else "subslide"}
                cells += [_page(text) for text in pages[1:]]
                px = layout.part(cells[-1]).px
    nb.cells = cells
    return nb


def _opens_section(text: str) -> bool:
    return text.lstrip().startswith(("# ", "## "))


def _next_shown(kinds: list[str], index: int) -> int | None:
    """The index of the cell the audience sees after cell ``index`` (None: the deck ends)."""
    return next(
        (i for i in range(index + 1, len(kinds)) if kinds[i] not in ("skip", "notes")), None
    )


def _lead_onto_next_slide(pages: list[str], code) -> tuple[list[str], int | None]:
    """A text whose last block introduces what the next slide shows (a heading, or a lead-in
    such as "Which ones this build has:") does not end its slide alone: it moves onto the next
    slide, above ``code`` (the code cell that opens that slide), when the code's output fits
    under it (its source left out, its printed text cut or its figures drawn smaller if need be:
    :func:`slide_layout.part` with the room the lead-in leaves); a heading that does not fit
    there stands on a slide of its own. Returns the pages and, when ``code`` now joins the last
    one, the room it has there (else None)."""
    blocks = layout.markdown_blocks(pages[-1])
    if not blocks or not layout.leads(blocks[-1]):
        return pages, None
    lead = blocks[-1]
    room = layout.SLIDE_PX - layout.part(nbformat.v4.new_markdown_cell(lead)).px
    fits = code is not None and code.cell_type == "code" and _first_fitting(code, room) > 0
    if len(blocks) > 1 and (fits or layout.heading_level(lead)):
        return [*pages[:-1], "\n\n".join(blocks[:-1]), lead], room if fits else None
    return pages, room if fits and len(blocks) == 1 else None


def _first_fitting(code, room: int) -> int:
    """How many of ``code``'s outputs fit in ``room`` pixels (all of them: their number; 0: not
    even the first one); the source goes where the outputs need its place."""
    outputs = code.get("outputs", [])
    for count in range(len(outputs), 0, -1):
        head = nbformat.v4.new_code_cell(code.source, outputs=outputs[:count])
        if layout.part(head, room).px <= room:
            return count
    return 0 if outputs or layout.part(code, room).px > room else 1


def _outputs_beyond(code, room: int) -> list:
    """Leave in ``code`` the outputs that fit in ``room`` (at least its first); return the others
    (a table's figure, say), which go on the slides after."""
    count = max(1, _first_fitting(code, room))
    rest = code.outputs[count:]
    code.outputs = code.outputs[:count]
    return rest


def _rest_of(outputs: list) -> list[nbformat.NotebookNode]:
    """The slides, one or more, for the outputs of a cell that did not fit on its own slide."""
    cell = nbformat.v4.new_code_cell(
        "",
        outputs=outputs,
        metadata={"slideshow": {"slide_type": "subslide"}, "transient": {"remove_source": True}},
    )
    rest = _outputs_beyond(cell, layout.SLIDE_PX) if len(outputs) > 1 else []
    shown = layout.part(cell)
    if shown.figure_scale < 1:
        _scale_figures(cell, shown.figure_scale)
    return [cell, *(_rest_of(rest) if rest else [])]


def tag(path: str | Path) -> bool:
    """Write the rules' slide metadata into the notebook at ``path``; True if anything changed."""
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell, kind in zip(nb.cells, slide_types(nb)):
        if cell.metadata.get("slideshow", {}).get("slide_type") != kind:
            cell.metadata["slideshow"] = {"slide_type": kind}
            changed = True
    if changed:
        nbformat.write(nb, path)
    return changed


def count_slides(nb) -> int:
    """Slides an audience sees: slides plus subslides (reveal.js's horizontal and vertical pages)."""
    return sum(
        cell.metadata.get("slideshow", {}).get("slide_type") in ("slide", "subslide")
        for cell in nb.cells
    )


def export(path: str | Path, out_dir: Path, urls: dict[str, str]) -> Path:
    """Write ``out_dir/<name>.slides.html`` for the notebook at ``path`` with its stored outputs.

    ``urls`` maps each asset of :mod:`course_tools.publish.assets` to a URL relative to
    ``out_dir``, so the slides open offline.
    """
    exporter = _exporter(tuple(sorted(urls.items())))
    nb = for_slides(nbformat.read(path, as_version=4))
    resources = {"metadata": {"name": Path(path).stem, "path": str(Path(path).parent)}}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    out = out_dir / f"{Path(path).stem}.slides.html"
    out.write_text(body, encoding="utf-8")
    return out


@functools.lru_cache(maxsize=4)
def _exporter(urls: tuple[tuple[str, str], ...]) -> Any:
    """One exporter per set of asset URLs, kept for the next deck: a new one compiles its Jinja
    templates again (~0.3 s of CPU of the ~1.3 s a deck takes)."""
    from nbconvert import SlidesExporter

    assets = dict(urls)
    return SlidesExporter(
        template_name="course_slides",
        extra_template_basedirs=[str(TEMPLATES)],
        extra_template_paths=[str(TEMPLATES)],  # course_mathjax.html.j2, shared with the site
        reveal_url_prefix=assets["reveal"],
        reveal_theme="white",
        reveal_width=str(SCREEN[0]),
        reveal_height=str(SCREEN[1]),
        reveal_scroll=True,
        reveal_transition="none",
        reveal_number="c/t",
        require_js_url=assets["require"],
        jquery_url=assets["jquery"],
        mathjax_url=assets["mathjax"],
        widget_renderer_url=assets["widgets"],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
