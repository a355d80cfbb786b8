"""How tall a lecture cell is on a slide, and what of a tall cell the slide shows.

The static slides are made for a 1280 x 720 screen (the course's slide style,
``templates/course_slides/static/course_slides.css``, sets the sizes these numbers follow). A
slide holds :data:`SLIDE_PX` pixels of content. Heights are estimated from a cell's source and
stored outputs, on the safe side; the browser test measures the real slides and fails on any that
overflow, so a wrong estimate is seen, not projected.

What a tall cell shows on its slide (everything stays in the notebook):

- a code cell whose source is longer than :data:`CODE_LINES` lines shows only its output (a
  cell with no output is then skipped); so does a code cell too tall for a slide with its source,
  unless cutting its printed text to :data:`OUTPUT_LINES` lines makes it fit;
- printed text taller than the room left (under a source or a figure) is cut on the slide to
  what fits, never by a single line; the rest follows on the next slides
  (:data:`CONTINUED_LINES` lines each);
- a markdown cell too tall for a slide continues on the slides after it (:func:`markdown_pages`):
  every word of a lecture's text reaches a slide.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from dataclasses import dataclass, field

#: content height of one slide (720 minus the slide's top and bottom padding, less a margin for
#: what the estimates leave out)
SLIDE_PX = 620
PROSE_LINE_PX, PROSE_CHARS, BLOCK_GAP_PX = 28, 96, 16
HEADING_PX = {1: 62, 2: 52, 3: 42}
CODE_LINE_PX, CODE_PAD_PX = 21, 24
#: the space around a code cell and between its source and its output
CODE_CELL_PX = 30
OUTPUT_LINE_PX, OUTPUT_PAD_PX = 18, 14
TABLE_ROW_PX, TABLE_PAD_PX = 30, 20
FIGURE_MAX_PX = 560
CONTENT_WIDTH_PX = 1220
WIDGET_PX = 420
#: a code cell with a longer source shows only its output on the slide (a shorter one shows
#: its source too, where source and output fit the slide together)
CODE_LINES = 24
#: printed text is cut to what fits; under a source, to no fewer than this many lines (below
#: that the source gives way instead)
OUTPUT_LINES = 16
#: figures of a cell that does not fit are drawn smaller, down to this scale, before its printed
#: text is cut further
MIN_FIGURE_SCALE = 0.6
#: the fewest lines of printed text a slide shows before cutting the rest
MIN_OUTPUT_LINES = 4
#: lines of a cut printed text per slide after its cell's (the rest of the text, alone)
CONTINUED_LINES = (SLIDE_PX - CODE_CELL_PX - OUTPUT_PAD_PX) // OUTPUT_LINE_PX - 1

_LINK = re.compile(r"\]\([^)]*\)")
#: a block that is a list, and where each of its top-level items starts
_LIST_ITEM = re.compile(r"(?:[-*+]|\d+\.)\s")
_TOP_LEVEL_ITEM = re.compile(r"\n(?=(?:[-*+]|\d+\.)\s)")
#: where a list item's nested blocks part (a blank line outside a fenced block)
_NESTED_PART = re.compile(r"\n\s*\n(?=\s*\S)")
_MARKUP = re.compile(r"[*`]|\\[a-zA-Z]+")


@dataclass
class Part:
    """What the slide shows of one cell: its height, and what it leaves to the notebook."""

    px: int
    hide_input: bool = False
    output_lines: int | None = None  # printed lines shown per text output (None: all)
    figure_scale: float = 1.0  # figures drawn smaller so that the cell fits its slide
    # a tall markdown cell's text, one slide each (empty: the cell fits one slide); ``px`` is then
    # the last page's height, the slide that the code after the cell joins
    pages: list[str] = field(default_factory=list)


def _text_px(text: str, chars: int = PROSE_CHARS) -> int:
    text = _MARKUP.sub("", _LINK.sub("]", text))
    return max(1, -(-len(text) // chars)) * PROSE_LINE_PX


def _block_px(block: str) -> int:
    lines = block.splitlines()
    first = lines[0].lstrip()
    if level := heading_level(block):
        rest = "\n".join(lines[1:]).strip()  # text on the lines under a heading, if any
        return HEADING_PX.get(level, HEADING_PX[3]) + (_text_px(rest) if rest else 0)
    if first.startswith("```"):
        return CODE_PAD_PX + CODE_LINE_PX * max(1, len(lines) - 2)
    if first.startswith("|"):
        return TABLE_PAD_PX + TABLE_ROW_PX * sum(not set(ln) <= set("|-: ") for ln in lines)
    if first.startswith("$$"):
        return 2 * PROSE_LINE_PX + PROSE_LINE_PX * max(0, len(lines) - 2)
    if "\n\n" in block:  # a list whose items hold more blocks (code, paragraphs), indented
        return sum(
            _block_px(part.strip("\n")) for part in _NESTED_PART.split(block) if part.strip()
        )
    items = re.split(r"\n(?=\s*(?:[-*+]|\d+\.)\s)", block)
    return sum(_text_px(item.replace("\n", " "), PROSE_CHARS - 6) for item in items)


def markdown_blocks(source: str) -> list[str]:
    """The blocks of a markdown cell: paragraphs, lists, tables and fenced code, in order."""
    blocks: list[str] = []
    current: list[str] = []
    fenced = False
    for line in source.strip().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            if current:
                blocks.append("\n".join(current))
            current = []
        elif not current and line[:1] in (" ", "\t") and blocks and _LIST_ITEM.match(blocks[-1]):
            current = [blocks.pop(), "", line]  # an indented block goes on the list item above
        else:
            current.append(line)
    if current:
        blocks.append("\n".join(current))
    return blocks


def _png_size(data: str) -> tuple[int, int] | None:
    head = base64.b64decode(data[:44] + "=" * (-len(data[:44]) % 4))
    return struct.unpack(">II", head[16:24]) if len(head) >= 24 else None


def _png_scale(width: int, height: int) -> float:
    return min(1.0, CONTENT_WIDTH_PX / max(width, 1), FIGURE_MAX_PX / max(height, 1))


def _png_px(data: str) -> int:
    """A stored PNG's height on a slide: at most the slide's width and FIGURE_MAX_PX."""
    size = _png_size(data)
    return FIGURE_MAX_PX if size is None else int(size[1] * _png_scale(*size))


def figure_width(data: str, scale: float) -> int | None:
    """The width a stored PNG is drawn at on a slide when its cell's figures are scaled."""
    size = _png_size(data)
    return None if size is None else int(size[0] * _png_scale(*size) * scale)


def printed_text(out) -> str | None:
    """The printed text of an output, if it is shown as text."""
    if out.get("output_type") == "stream":
        return "".join(out.get("text", ""))
    data = out.get("data", {})
    if out.get("output_type") == "error":
        return "\n".join(out.get("traceback", []))
    if set(data) & {"image/png", "image/svg+xml", "text/html", "text/latex", "text/markdown"}:
        return None
    if "application/vnd.jupyter.widget-view+json" in data:
        return None
    return "".join(data.get("text/plain", "")) if "text/plain" in data else None


def output_px(out, max_lines: int | None = None) -> int:
    """Height of one stored output on a slide, with at most ``max_lines`` lines of text."""
    text = printed_text(out)
    if text is not None:
        lines = len(text.rstrip("\n").splitlines())
        shown = lines if max_lines is None or lines <= max_lines else max_lines + 1
        return OUTPUT_PAD_PX + OUTPUT_LINE_PX * shown
    data = out.get("data", {})
    if "image/png" in data:
        return _png_px("".join(data["image/png"]))
    if "image/svg+xml" in data:
        return FIGURE_MAX_PX
    if "application/vnd.jupyter.widget-view+json" in data:
        return WIDGET_PX
    if "text/html" in data:
        html = "".join(data["text/html"])
        if "course-snapshot" in html:  # an explorer's snapshot: paragraphs of text
            paragraphs = re.split(r"</p>|<br\s*/?>", html)
            texts = [re.sub(r"<[^>]+>", "", par).strip() for par in paragraphs]
            return OUTPUT_PAD_PX + sum(_text_px(text) for text in texts if text)
        return TABLE_PAD_PX + TABLE_ROW_PX * max(1, html.count("<tr"))
    return PROSE_LINE_PX * 2


def _code_part(cell, room: int = SLIDE_PX) -> Part:
    outputs = cell.get("outputs", [])
    lines = len(cell.source.strip().splitlines())
    input_px = CODE_PAD_PX + CODE_LINE_PX * lines
    figures = sum(output_px(o) for o in outputs if "image/png" in o.get("data", {}))
    longest = max((len((printed_text(o) or "").splitlines()) for o in outputs), default=0)

    def height(shown: int) -> int:
        return sum(output_px(out, shown) for out in outputs)

    hide, shown = lines > CODE_LINES, longest
    if not hide:  # the source stays if the outputs fit under it, printed text cut at most to
        # OUTPUT_LINES lines
        under = room - CODE_CELL_PX - input_px
        cuts = range(longest, min(longest, OUTPUT_LINES) - 1, -1)
        fit = next((n for n in cuts if height(n) <= under), None)
        hide, shown = fit is None, longest if fit is None else fit
    if hide:  # the outputs alone: printed text cut to what fits, figures drawn smaller if need be
        smaller = figures * (1 - MIN_FIGURE_SCALE)
        while CODE_CELL_PX + height(shown) - smaller > room and shown > MIN_OUTPUT_LINES:
            shown -= 1
    px = height(shown)
    scale = 1.0
    if figures and CODE_CELL_PX + px > room:  # the figures give way to the rest
        scale = max(MIN_FIGURE_SCALE, (room - CODE_CELL_PX - (px - figures)) / figures)
        px += math.ceil(figures * scale) - figures
    return Part(
        px=CODE_CELL_PX + px + (0 if hide else input_px),
        hide_input=hide,
        figure_scale=scale,
        # a text one line longer than what is shown is shown whole: its last line takes the
        # place the line saying what was cut would take
        output_lines=shown if longest > shown + 1 else None,
    )


def heading_level(block: str) -> int:
    """1-6 for a heading block, 0 for any other."""
    first = block.lstrip()
    return len(first) - len(first.lstrip("#")) if first.startswith("#") else 0


def leads(block: str) -> bool:
    """Whether a block introduces the next one and must not end a slide without it: a heading,
    or a paragraph that ends with a colon or runs on into the next block ("In this unit you" and
    a list)."""
    start = block.lstrip()
    other = start.startswith(("|", "```", "$$")) or _LIST_ITEM.match(start)  # a table, code, a
    # formula or a list; a paragraph may start with bold text or inline code
    return heading_level(block) > 0 or (not other and not block.rstrip().endswith((".", "!", "?")))


def _unit_px(text: str, continues: bool) -> int:
    return _block_px(text) + (0 if continues else BLOCK_GAP_PX)


def _pages(source: str) -> list[tuple[str, int]]:
    """(text, height) of each slide a markdown cell's source fills."""
    pages: list[list[tuple[str, bool]]] = [[]]
    queue = [(block, False) for block in markdown_blocks(source)]
    while queue:
        text, continues = queue.pop(0)
        page = pages[-1]
        if page and 1 <= heading_level(text) <= 2:  # a section starts its own slide
            pages.append([])
        elif page and sum(_unit_px(*u) for u in page) + _unit_px(text, continues) > SLIDE_PX:
            lead = leads(page[-1][0])
            too_tall = _unit_px(text, False) > SLIDE_PX
            if _LIST_ITEM.match(text) and not continues and (too_tall or lead):
                # a list goes on item by item: under its lead, or over as many slides as it needs
                items = _TOP_LEVEL_ITEM.split(text)
                if len(items) > 1:
                    queue[:0] = [(item, i > 0) for i, item in enumerate(items)]
                    continue
            # the next slide, with the heading or lead-in that the slide ended on
            carry = [page.pop()] if len(page) > 1 and lead else []
            pages.append(carry)
            continues = False  # on its new slide, a list's next item starts the block
        pages[-1].append((text, continues))
    return [(_join(page), sum(_unit_px(*u) for u in page)) for page in pages]


def _join(page: list[tuple[str, bool]]) -> str:
    """A page's text: blocks apart, the items of one list together."""
    return "".join(
        ("\n" if continues else "\n\n") + unit if i else unit
        for i, (unit, continues) in enumerate(page)
    )


def markdown_pages(source: str) -> list[str]:
    """A markdown cell's text, one slide each: a ``#`` or ``##`` heading (a section) starts a
    slide; blocks fill a slide in order and the first that does not fit starts the next; a
    heading or a lead-in paragraph (one that ends without a full stop) moves on with the block
    after it, or keeps the first items of a list after it; a list taller than a slide continues
    on the next one item by item, an item's nested blocks with it."""
    return [text for text, _ in _pages(source)]


def _markdown_part(cell) -> Part:
    pages = _pages(cell.source)
    if len(pages) == 1:
        return Part(px=pages[0][1])
    return Part(px=pages[-1][1], pages=[text for text, _ in pages])


def part(cell, room: int = SLIDE_PX) -> Part:
    """What a slide shows of ``cell`` and how tall it is there; a code cell shows what fits in
    ``room`` pixels (less than a slide under a lead-in that introduces it)."""
    if cell.cell_type == "code":
        return _code_part(cell, room)
    if cell.cell_type == "markdown":
        return _markdown_part(cell)
    return Part(px=0)


def cut_text(text: str, lines: int) -> str:
    """The first ``lines`` lines of printed ``text``, and one line saying how many follow (on the
    next slides)."""
    all_lines = text.rstrip("\n").splitlines()
    rest = len(all_lines) - lines
    return "\n".join(all_lines[:lines] + [f"⋯ {rest} more lines on the next slide"]) + "\n"
