"""The course as static HTML, for reading without a kernel: ``make site``.

Built with nbconvert, the exporter Jupyter itself uses for "Save and Export as HTML": it renders
exactly the stored outputs JupyterLab shows (tables, figures, the stored state of the "Explore"
widgets, formulas), needs nothing beyond the Jupyter stack the course already installs, and its
output is plain files. (Jupyter Book would add a Sphinx tool chain and a theme to keep in step for
the same pages.) Each lecture and exercise page is titled by its unit and opens with links to
the index and to the previous and next pages of its kind; links between notebooks point to their
pages. Layout of ``build/site/``::

    index.html                  the course map (from README.md's table) with links
    references.html             docs/references.md (the lectures' citations link its headings)
    lectures/NN_topic.html      each lecture with outputs
    slides/NN_topic.slides.html each lecture as reveal.js slides
    exercises/NN_topic.html     each exercise as the generator makes it from its solution (and the
                                .ipynb to download); never the working copy's exercises/
    vendor/                     reveal.js, require.js, MathJax, the widgets manager (offline)
"""

from __future__ import annotations

import functools
import html
import re
from pathlib import Path
from typing import Any

from course_lib import catalogue
from course_tools.publish import assets, navigation, slides, snapshots

ROOT = Path(__file__).resolve().parents[2]


def course_map(readme: Path = ROOT / "README.md") -> list[dict[str, str]]:
    """The rows of README.md's course table: unit, title, what is measured, status
    (:func:`course_lib.catalogue.readme_table`)."""
    return catalogue.readme_table(readme)


def _relative(urls: dict[str, str], prefix: str) -> dict[str, str]:
    return {key: f"{prefix}{url}" for key, url in urls.items()}


@functools.lru_cache(maxsize=4)
def _html_exporter(urls: tuple[tuple[str, str], ...]) -> Any:
    """One exporter per set of asset URLs, kept for the next page (as slides._exporter does):
    nbconvert's lab template with the course's MathJax setting (templates/course_page)."""
    from nbconvert import HTMLExporter

    assets = dict(urls)
    return HTMLExporter(
        template_name="course_page",
        extra_template_basedirs=[str(slides.TEMPLATES)],
        extra_template_paths=[str(slides.TEMPLATES)],  # course_mathjax.html.j2
        require_js_url=assets["require"],
        mathjax_url=assets["mathjax"],
        widget_renderer_url=assets["widgets"],
    )


def _export_html(path: Path, out_dir: Path, urls: dict[str, str]) -> Path:
    """The page of the notebook at ``path``: its stored outputs, each "Explore" widget's snapshot
    in place of the widget (:mod:`course_tools.publish.snapshots`)."""
    import nbformat

    nb = snapshots.static(nbformat.read(path, as_version=4))
    resources = {"metadata": {"name": path.stem, "path": str(path.parent)}}
    body, _ = _html_exporter(tuple(sorted(urls.items()))).from_notebook_node(nb, resources)
    out = out_dir / f"{path.stem}.html"
    out.write_text(body, encoding="utf-8")
    return out


NAV_STYLE = (
    "<style>.course-nav { font: 15px/1.4 system-ui, sans-serif; padding: .5em 1em;"
    " border-bottom: 1px solid #ddd; } .course-nav a { margin-right: 1.2em; }</style>"
)
#: links written for JupyterLab and GitHub (in the lectures' markdown) and their site pages
LINK_REWRITES = (
    (r'href="(\d\d_\w+)\.ipynb(#[^"]*)?"', r'href="\1.html\2"'),
    (r'href="\.\./exercises/(\d\d_\w+)\.ipynb(#[^"]*)?"', r'href="../exercises/\1.html\2"'),
    (r'href="\.\./docs/references\.md(#[^"]*)?"', r'href="../references.html\1"'),
    (r'href="\.\./README\.md(#[^"]*)?"', r'href="../index.html"'),
)


def _page_navigation(stem: str, kind: str) -> tuple[str, str]:
    """(title, nav bar) of the ``kind`` page ("lecture" or "exercises") of the lecture ``stem``."""
    before, this, after = navigation.neighbours(stem)
    title = this.label if kind == "lecture" else f"{this.label}: exercises"
    links = ['<a href="../index.html">All units</a>']
    if before is not None:
        links.append(f'<a href="{before.stem}.html" rel="prev">← {html.escape(before.label)}</a>')
    if after is not None:
        links.append(f'<a href="{after.stem}.html" rel="next">{html.escape(after.label)} →</a>')
    other = "exercises" if kind == "lecture" else "lectures"
    links.append(
        f'<a href="../{other}/{stem}.html">{"Exercises" if kind == "lecture" else "Lecture"}</a>'
    )
    return title, f'<nav class="course-nav">{" ".join(links)}</nav>'


def _with_navigation(page: Path, stem: str, kind: str) -> None:
    """Title ``page`` by its unit, put the navigation bar on top, point notebook links to pages."""
    title, nav = _page_navigation(stem, kind)
    body = page.read_text(encoding="utf-8")
    body = re.sub(
        r"<title>.*?</title>", f"<title>{html.escape(title)}</title>", body, count=1, flags=re.S
    )
    body = body.replace("</head>", f"{NAV_STYLE}\n</head>", 1)
    body = re.sub(r"(<body[^>]*>)", lambda m: f"{m.group(1)}\n{nav}", body, count=1)
    for pattern, replacement in LINK_REWRITES:
        body = re.sub(pattern, replacement, body)
    page.write_text(body, encoding="utf-8")


def _references(out: Path, source: Path = ROOT / "docs" / "references.md") -> Path:
    """docs/references.md as ``out/references.html``, headings anchored as GitHub anchors them."""
    import mistune

    def anchor(match: re.Match[str]) -> str:
        text = re.sub(r"<[^>]+>", "", match.group(2))
        return f'<h{match.group(1)} id="{navigation.github_slug(html.unescape(text))}">'

    body = re.sub(
        r"<h([1-6])>(.*?)(?=</h\1>)",
        lambda m: anchor(m) + m.group(2),
        str(mistune.html(source.read_text(encoding="utf-8"))),
    )
    page = out / "references.html"
    page.write_text(
        f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>References: training large neural networks</title>
<style>body {{ font: 17px/1.5 system-ui, sans-serif; max-width: 50em; margin: 2em auto; padding: 0 1em; }}</style>
</head><body><p><a href="index.html">All units</a></p>
{body}</body></html>
""",
        encoding="utf-8",
    )
    return page


def _inline(text: str) -> str:
    """A README table cell as HTML: escaped, its `code spans` as <code> (not literal backticks)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _index(rows: list[dict[str, str]], built: dict[str, str]) -> str:
    items = []
    for row in rows:
        stem = built.get(row["unit"])
        if stem:
            links = (
                f'<a href="lectures/{stem}.html">lecture</a> · '
                f'<a href="slides/{stem}.slides.html">slides</a> · '
                f'<a href="exercises/{stem}.html">exercises</a> '
                f'(<a href="exercises/{stem}.ipynb" download>.ipynb</a>)'
            )
        else:
            links = f"<em>{html.escape(row['status'])}</em>"
        items.append(
            f"<tr><td>{row['unit']}</td><td>{_inline(row['title'])}</td>"
            f"<td>{_inline(row['measures'])}</td><td>{links}</td></tr>"
        )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Training large neural networks: the course</title>
<style>
body {{ font: 17px/1.5 system-ui, sans-serif; max-width: 70em; margin: 2em auto; padding: 0 1em; }}
table {{ border-collapse: collapse; width: 100%; }}
td, th {{ border-bottom: 1px solid #ddd; padding: .45em .6em; text-align: left; vertical-align: top; }}
th {{ background: #f4f4f4; }}
</style></head><body>
<h1>Training large neural networks, measured on your own machine</h1>
<p>Each unit is a JupyterLab notebook that measures what it teaches. These pages show the
lectures as they were run (outputs stored); to run them and do the graded exercises, clone the
course and run <code>make lab</code>. The slides open offline; press <kbd>s</kbd> for the speaker view
and <kbd>Esc</kbd> for an overview.</p>
<p>Works cited, and the course's background reading: <a href="references.html">references</a>.</p>
<table><tr><th>Unit</th><th>Title</th><th>What you measure</th><th>Read</th></tr>
{chr(10).join(items)}
</table></body></html>
"""


def _generated_exercise(solution: Path, folder: Path) -> Path | None:
    """The exercise as the generator makes it from ``solution``, written into ``folder``.

    Never the working copy's ``exercises/``: a learner's or an instructor's filled-in answers and
    outputs there must not reach a published page."""
    from course_lib.grading.exercises import make_exercise, read_notebook, render_notebook

    if not solution.exists():
        return None
    nb = make_exercise(read_notebook(solution), solution, solution_rel=f"solutions/{solution.name}")
    path = folder / solution.name
    path.write_text(render_notebook(nb), encoding="utf-8")
    return path


def build(out: Path = ROOT / "build" / "site", *, units: list[str] | None = None) -> Path:
    """Write the site under ``out`` (lectures, slides, exercises, index); return index.html."""
    rows = course_map()
    lectures = [u.lecture for u in catalogue.units(ROOT) if u.lecture is not None]
    if units is not None:
        known = [p.name[:2] for p in lectures]
        bad = [u for u in units if u not in known]
        if bad:
            raise ValueError(f"units = {bad} not found; valid: {', '.join(known)}")
        lectures = [p for p in lectures if p.name[:2] in units]
    out.mkdir(parents=True, exist_ok=True)
    urls = assets.install(out / "vendor")
    built = {}
    for folder in ("lectures", "slides", "exercises"):
        (out / folder).mkdir(exist_ok=True)
    for lecture in lectures:
        page = _export_html(lecture, out / "lectures", _relative(urls, "../vendor/"))
        _with_navigation(page, lecture.stem, "lecture")
        slides.export(lecture, out / "slides", _relative(urls, "../vendor/"))
        exercise = _generated_exercise(ROOT / "solutions" / lecture.name, out / "exercises")
        if exercise is not None:
            page = _export_html(exercise, out / "exercises", _relative(urls, "../vendor/"))
            _with_navigation(page, lecture.stem, "exercises")
        built[lecture.name[:2]] = lecture.stem
    _references(out)
    index = out / "index.html"
    index.write_text(_index(rows, built), encoding="utf-8")
    return index


def build_slides(
    out: Path = ROOT / "build" / "slides", *, units: list[str] | None = None
) -> list[Path]:
    """Write only the slides (``make slides``) under ``out``, with their assets."""
    lectures = [u.lecture for u in catalogue.units(ROOT) if u.lecture is not None]
    if units is not None:
        lectures = [p for p in lectures if p.name[:2] in units]
    out.mkdir(parents=True, exist_ok=True)
    urls = assets.install(out / "vendor")
    return [slides.export(p, out, _relative(urls, "./vendor/")) for p in lectures]
