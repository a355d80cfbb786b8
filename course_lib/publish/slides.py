"""Lectures as slides: the slide metadata of every lecture, and static reveal.js slides.

An instructor presents a lecture live in JupyterLab (``jupyterlab-rise``, installed by
``make lab``: cells run, widgets work) or from the static slides ``make slides`` writes. Both read
the ``slideshow.slide_type`` metadata of each cell, which :func:`tag` sets by the rules below so
that every lecture follows them and an edited lecture is re-tagged by ``make notebooks``:

- a markdown cell with a ``#`` or ``##`` heading starts a **slide** (a section: one column in
  reveal.js);
- any other markdown cell starts a **subslide** (one idea: the text and the code that follows it);
- a code cell belongs to the (sub)slide of the text above it, except that a figure gets a
  subslide of its own when its subslide already has a figure or more than
  :data:`TEXT_LINES_WITH_FIGURE` lines of text, and the setup cell (the first code cell: imports and
  constants) is **skipped**;
- a cell tagged ``slide:<type>`` (``slide:skip``, ``slide:subslide``, ``slide:fragment``, ...)
  overrides the rules, for the cases they get wrong.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

#: a figure after more text than this on its subslide gets a subslide of its own (what fits a
#: 1400 x 860 screen at the slides' type size is about 18 lines of text, or a figure and 8)
TEXT_LINES_WITH_FIGURE = 8
TEMPLATES = Path(__file__).parent / "templates"
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


def slide_types(nb) -> list[str]:
    """The slide type of each cell of ``nb`` by the rules of this module."""
    kinds: list[str] = []
    first_code = True
    figures = 0  # figures on the current subslide
    lines = 0  # lines of text on the current subslide
    for index, cell in enumerate(nb.cells):
        kind = _override(cell)
        if cell.cell_type == "markdown":
            text = cell.source.lstrip()
            section = any(line.startswith(("# ", "## ")) for line in text.splitlines())
            rule = "slide" if index == 0 or section else "subslide"
        elif cell.cell_type == "code":
            if first_code:
                rule = "skip"
            elif _has_figure(cell) and (figures or lines > TEXT_LINES_WITH_FIGURE):
                rule = "subslide"
            else:
                rule = "-"
            first_code = False
        else:
            rule = "skip"
        kind = kind or rule
        if kind in ("slide", "subslide"):
            figures = lines = 0
        if kind != "skip" and cell.cell_type == "markdown":
            lines += len(cell.source.strip().splitlines())
        if kind != "skip" and cell.cell_type == "code" and _has_figure(cell):
            figures += 1
        kinds.append(kind)
    return kinds


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

    ``urls`` maps each asset of :mod:`course_lib.publish.assets` to a URL relative to
    ``out_dir``, so the slides open offline.
    """
    from nbconvert import SlidesExporter

    exporter = SlidesExporter(
        template_name="course_slides",
        extra_template_basedirs=[str(TEMPLATES)],
        reveal_url_prefix=urls["reveal"],
        reveal_theme="white",
        reveal_scroll=True,
        reveal_transition="none",
        reveal_number="c/t",
        require_js_url=urls["require"],
        jquery_url=urls["jquery"],
        mathjax_url=urls["mathjax"],
        widget_renderer_url=urls["widgets"],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    body, _ = exporter.from_filename(str(path))
    out = out_dir / f"{Path(path).stem}.slides.html"
    out.write_text(body, encoding="utf-8")
    return out
