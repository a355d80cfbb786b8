"""Does every slide of a static deck fit the screen? The check the browser test runs on each deck.

:data:`WALK` runs in the page of one deck written by ``make slides``: it visits every slide
(reveal.js's horizontal and vertical pages, the first one as it is drawn on opening, before any
navigation) and reports, per slide,

- **overflow**: the slide is not inside the screen, its content is taller or wider than the
  slide (the course's slides scroll then: what nobody scrolls in a lecture hall, and what a
  projector of a plain reveal.js deck cuts off), or a block in it (a cell, an output, a printed
  text, a table, a figure) is cut or scrolls, down or sideways (the deck draws a wide block in a
  smaller font until it fits, down to 10 px: the slide template's ``fitWide``), or reaches past
  the slide's right edge (cut there by a box around it);
- **mid-word wraps**: a line break between two word characters (``[A-Za-z0-9_]``) of one text node:
  ``activat|ions`` or ``12|345`` broken over two lines. Breaks at spaces, hyphens and slashes are
  fine. Formulas (MathJax) and speaker notes are not looked at;
- **broken formulas**: a formula MathJax broke over lines (its TeX). nbconvert's MathJax setting
  breaks one that is wider than its box, and a table cell's box is narrow while MathJax measures
  it: each formula of unit 11's activation table stood on four to seven lines, the table ran off
  its slide. The deck turns that setting off (course_tools/publish/templates/course_mathjax.html.j2);
  this finds a formula broken anyway. A slide with formulas in a table is read once the deck has
  typeset them again, as it does for every slide shown (what the audience sees).

:func:`walk_deck` opens one deck in a Playwright page and returns that report.
"""

from __future__ import annotations

import time
from pathlib import Path

#: the projector the slides are made for
SCREEN = {"width": 1280, "height": 720}

#: The formulas MathJax (2, as nbconvert's pages load it) broke over lines in a part of a page,
#: as [element, TeX] pairs: its line-breaking stacks the pieces in .mjx-block rows; the TeX
#: sits in the script element whose id is the formula frame's without "-Frame".
BROKEN = r"""root => [...root.querySelectorAll('.MathJax_CHTML')]
    .filter(el => el.querySelector('.mjx-block'))
    .map(el => [el, (document.getElementById(el.id.replace(/-Frame$/, '')) || el).textContent])"""

WALK = (
    r"""async () => {
    const defined = require.s.contexts._.defined;
    const key = Object.keys(defined).find(k => k.endsWith('dist/reveal.js'));
    const Reveal = window.Reveal || defined[key];
    const W = window.innerWidth, H = window.innerHeight, TOL = 1;
    const skip = el => el.closest('aside.notes, .MathJax, .MathJax_CHTML, mjx-container, '
                                  + 'script, style, .MathJax_Preview');
    // content larger than its box, scrolled or cut (a few pixels are line-height rounding)
    const BLOCKS = 'div.jp-Cell, div.jp-OutputArea-output, pre, table, img, .jupyter-widgets';
    const cut = (el, s) => s.overflowY !== 'visible' && el.scrollHeight > el.clientHeight + 4;
    const wide = (el, s) => s.overflowX !== 'visible' && el.scrollWidth > el.clientWidth + 4;
    const name = el => el.tagName.toLowerCase() + '.' + String(el.className).split(' ')[0];
    const overflow = slide => {
        // the slide scrolls (its overflow is auto) when anything in it reaches past its box,
        // so its scroll size covers every box but those inside blocks that clip or scroll
        // themselves: those are checked one by one
        const out = [], r = slide.getBoundingClientRect();
        if (r.left < -TOL || r.top < -TOL || r.right > W + TOL || r.bottom > H + TOL)
            out.push('the slide is not inside the screen: ' + [r.left, r.top, r.right, r.bottom]
                     .map(Math.round).join(','));
        if (slide.scrollHeight > slide.clientHeight + 4)
            out.push('the slide scrolls vertically (' + slide.scrollHeight + ' px of content in '
                     + slide.clientHeight + ')');
        if (slide.scrollWidth > slide.clientWidth + 4)
            out.push('the slide scrolls sideways (' + slide.scrollWidth + ' px of content in '
                     + slide.clientWidth + ')');
        // a block reaching past the slide's content box on the right is cut there by a box
        // around it that clips (a padded code block as wide as its cell: unit 15's code lines
        // ran under the cell's edge, the block itself not scrolling)
        const right = r.right - parseFloat(getComputedStyle(slide).paddingRight);
        for (const el of slide.querySelectorAll(BLOCKS)) {
            if (skip(el)) continue;
            const s = getComputedStyle(el);
            const reach = el.getBoundingClientRect().right;
            if (el.getClientRects().length && reach > right + 2)
                out.push(name(el) + ' reaches past the slide\'s right edge by '
                         + Math.round(reach - right) + ' px');
            if (cut(el, s)) out.push(name(el) + ' is cut or scrolls vertically ('
                                     + el.scrollHeight + ' px of content in ' + el.clientHeight + ')');
            if (wide(el, s)) out.push(name(el) + ' is cut or scrolls sideways ('
                                      + el.scrollWidth + ' px of content in ' + el.clientWidth + ')');
        }
        return out;
    };
    const top = (node, i) => {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rects = range.getClientRects();
        return rects.length ? rects[0].top : null;
    };
    const wraps = slide => {
        const found = [];
        const walker = document.createTreeWalker(slide, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const parent = node.parentElement;
            if (!parent || skip(parent) || !parent.getClientRects().length) continue;
            const text = node.data;
            const whole = document.createRange();
            whole.selectNodeContents(node);
            const tops = new Set([...whole.getClientRects()].map(r => Math.round(r.top)));
            if (tops.size < 2) continue;  // on one line
            for (const m of text.matchAll(/\S{2,}/g)) {
                const range = document.createRange();
                range.setStart(node, m.index);
                range.setEnd(node, m.index + m[0].length);
                const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
                if (lines.size < 2) continue;
                for (let i = m.index + 1; i < m.index + m[0].length; i++) {
                    const a = top(node, i - 1), b = top(node, i);
                    if (a !== null && b !== null && b > a + 2
                        && /\w/.test(text[i - 1]) && /\w/.test(text[i])) {
                        found.push(m[0].slice(0, 40));
                        break;
                    }
                }
            }
        }
        return found;
    };
    const broken = slide => ("""
    + BROKEN
    + r""")(slide)
        .filter(([el]) => !skip(el.parentElement)).map(([, tex]) => tex.slice(0, 40));
    const settle = async slide => {
        const state = () => [...slide.querySelectorAll('td, th')]
            .map(cell => Math.round(cell.getBoundingClientRect().width)).join(',')
            + '|' + slide.querySelectorAll('.MathJax_CHTML').length
            + '|' + slide.querySelectorAll('.mjx-block').length;
        const start = performance.now();
        let last = state(), since = start;
        while (performance.now() - start < 2000 && performance.now() - since < 250) {
            await new Promise(done => setTimeout(done, 20));
            const now = state();
            if (now !== last) [last, since] = [now, performance.now()];
        }
    };
    const report = [];
    const slides = Reveal.getSlides();
    for (let n = 0; n < slides.length; n++) {
        const slide = slides[n];
        const {h, v} = Reveal.getIndices(slide);
        // the first slide as it is drawn on opening; the others as reveal.js shows them
        // (layout is read synchronously: waiting for a frame changes nothing but the time), and
        // a slide with formulas in a table as the audience sees it: the deck typesets a shown
        // slide's formulas again, and MathJax does it in steps (here a formula broke ~150 ms
        // after the slide changed, its queue long empty), so wait until nothing has changed
        // for 250 ms (at most 2 s). A table cell is the box whose width its formulas change.
        if (n > 0) Reveal.slide(h, v);
        if (slide.querySelector('td script[type^="math/tex"], th script[type^="math/tex"]'))
            await settle(slide);
        report.push({h, v, overflow: overflow(slide).slice(0, 3), wraps: wraps(slide),
                     broken: broken(slide)});
    }
    return report;
}"""
)


def walk_deck(page, deck: Path) -> tuple[list[dict], float]:
    """Open the deck at ``deck`` in ``page`` and walk it: (per-slide report, seconds)."""
    start = time.perf_counter()
    page.goto(deck.as_uri())
    page.wait_for_selector(".reveal.ready", timeout=30_000)
    page.evaluate("() => document.fonts.ready")
    # MathJax typesets after the page is ready: wait until its queue has run (the formulas as
    # first drawn, on slides hidden at the time)
    page.evaluate(
        "() => new Promise(done => window.MathJax && MathJax.Hub ? MathJax.Hub.Queue(done) : done())"
    )
    report = page.evaluate(WALK)
    return report, time.perf_counter() - start
