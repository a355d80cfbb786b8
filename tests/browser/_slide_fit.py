"""Does every slide of a static deck fit the screen? The check the browser test runs on each deck.

:data:`WALK` runs in the page of one deck written by ``make slides``: it visits every slide
(reveal.js's horizontal and vertical pages, the first one as it is drawn on opening, before any
navigation) and reports, per slide,

- **overflow**: a visible box of the slide reaches past the viewport (what a projector cuts off),
  or the slide scrolls vertically (what nobody scrolls in a lecture hall). A box inside a block
  that scrolls sideways (a wide printed table) is measured where that block clips it: scrolling a
  wide table sideways is allowed, a table taller than the screen is not;
- **mid-word wraps**: a line break between two word characters (``[A-Za-z0-9_]``) of one text node:
  ``activat|ions`` or ``12|345`` broken over two lines. Breaks at spaces, hyphens and slashes are
  fine. Formulas (MathJax) and speaker notes are not looked at.

:func:`walk_deck` opens one deck in a Playwright page and returns that report.
"""

from __future__ import annotations

import time
from pathlib import Path

#: the projector the slides are made for
SCREEN = {"width": 1280, "height": 720}

WALK = r"""async () => {
    const defined = require.s.contexts._.defined;
    const key = Object.keys(defined).find(k => k.endsWith('dist/reveal.js'));
    const Reveal = window.Reveal || defined[key];
    const frame = () => new Promise(done => requestAnimationFrame(() => done()));
    const W = window.innerWidth, H = window.innerHeight, TOL = 1;
    const skip = el => el.closest('aside.notes, .MathJax, .MathJax_CHTML, mjx-container, '
                                  + 'script, style, .MathJax_Preview');
    // content taller than its box, scrolled or cut (a few pixels are line-height rounding)
    const scrolls = (el, s) => s.overflowY !== 'visible' && el.scrollHeight > el.clientHeight + 4;
    const overflow = slide => {
        // pre-order walk: each box is clipped by its ancestors that clip (a block scrolling
        // sideways shows only its own width of a wide table)
        const out = [], clip = new Map();
        const view = {left: 0, top: 0, right: W, bottom: H};
        const all = [slide, ...slide.querySelectorAll('*')];
        for (const el of all) {
            const parentClip = el === slide ? null : clip.get(el.parentElement);
            if (el !== slide && parentClip === undefined) continue;  // under a skipped box
            if (skip(el)) continue;
            const s = getComputedStyle(el), r = el.getBoundingClientRect();
            if (s.display === 'none') continue;
            let box = {left: r.left, top: r.top, right: r.right, bottom: r.bottom};
            if (parentClip) box = {left: Math.max(box.left, parentClip.left),
                                   top: Math.max(box.top, parentClip.top),
                                   right: Math.min(box.right, parentClip.right),
                                   bottom: Math.min(box.bottom, parentClip.bottom)};
            const clips = s.overflowX !== 'visible' || s.overflowY !== 'visible';
            clip.set(el, clips ? box : (parentClip || {left: -1e9, top: -1e9, right: 1e9,
                                                       bottom: 1e9}));
            if (scrolls(el, s)) out.push(el.tagName.toLowerCase() + '.'
                + String(el.className).split(' ')[0] + ' is cut or scrolls vertically ('
                + el.scrollHeight + ' px of content in ' + el.clientHeight + ')');
            if (r.width === 0 || r.height === 0 || s.visibility === 'hidden') continue;
            if (box.right <= box.left || box.bottom <= box.top) continue;
            if (box.right > view.right + TOL || box.bottom > view.bottom + TOL
                || box.left < view.left - TOL || box.top < view.top - TOL) {
                out.push(el.tagName.toLowerCase() + '.' + String(el.className).split(' ')[0]
                         + ' at ' + [box.left, box.top, box.right, box.bottom]
                         .map(Math.round).join(','));
            }
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
    const report = [];
    const slides = Reveal.getSlides();
    for (let n = 0; n < slides.length; n++) {
        const slide = slides[n];
        const {h, v} = Reveal.getIndices(slide);
        if (n > 0) Reveal.slide(h, v);   // the first slide as it is drawn on opening
        await frame(); await frame();
        report.push({h, v, overflow: overflow(slide).slice(0, 3), wraps: wraps(slide)});
    }
    return report;
}"""


def walk_deck(page, deck: Path) -> tuple[list[dict], float]:
    """Open the deck at ``deck`` in ``page`` and walk it: (per-slide report, seconds)."""
    start = time.perf_counter()
    page.goto(deck.as_uri())
    page.wait_for_selector(".reveal.ready", timeout=30_000)
    page.evaluate("() => document.fonts.ready")
    report = page.evaluate(WALK)
    return report, time.perf_counter() - start


def summary(report: list[dict]) -> tuple[int, int, int]:
    """(slides, slides that overflow, mid-word wraps) of one deck's report."""
    return (
        len(report),
        sum(bool(s["overflow"]) for s in report),
        sum(len(s["wraps"]) for s in report),
    )
