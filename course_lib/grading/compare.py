"""How the grader compares a learner's outputs with the solution's: nbval's rules (streams joined,
the keys nbval skips, images included, left out), so a ✓ line matches exactly what nbval compares.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

# output keys nbval never compares (its default skip_compare list, images included)
SKIP_COMPARE = frozenset(
    {
        "metadata",
        "traceback",
        "prompt_number",
        "output_type",
        "name",
        "execution_count",
        "application/vnd.jupyter.widget-view+json",
        "image/png",
        "image/jpeg",
    }
)


_carriagereturn = re.compile(r"^.*\r(?=[^\n])", re.MULTILINE)


def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def coalesce_streams(outputs: list) -> list[dict]:
    """Merge stream outputs of the same name and drop text overwritten by ``\\r`` (as nbval does).

    nbval.plugin.coalesce_streams also has a backspace rule, but its loop never runs (it compares
    the text with itself before substituting), so backspaces are left alone here too.
    """
    merged: list[dict] = []
    streams: dict[str | None, dict] = {}
    for output in outputs:
        output = dict(output)
        if output.get("output_type") == "stream":
            text = output.get("text", "")
            text = "".join(text) if isinstance(text, list) else text
            if output.get("name") in streams:
                streams[output["name"]]["text"] += text
                continue
            output["text"] = text
            streams[output.get("name")] = output
        merged.append(output)
    for output in streams.values():
        output["text"] = _carriagereturn.sub("", output["text"])
    return merged


def _sanitize(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = "".join(value)
    if not isinstance(value, str):
        return value
    return "\n".join(line.rstrip() for line in value.rstrip().split("\n"))


def _comparable(outputs: list) -> dict[str, list]:
    flat: dict[str, list] = defaultdict(list)
    for output in coalesce_streams(outputs):
        kind = output.get("output_type")
        if kind == "stream":
            flat[output.get("name", "stdout")].append(_sanitize(output.get("text", "")))
        elif kind in ("display_data", "execute_result"):
            for key, value in output.get("data", {}).items():
                if key not in SKIP_COMPARE:
                    flat[key].append(_sanitize(value))
        elif kind == "error":
            flat["error"].append(f"{output.get('ename')}: {output.get('evalue')}")
    return flat


def _show(values: list) -> str:
    text = "\n".join(v if isinstance(v, str) else json.dumps(v, sort_keys=True) for v in values)
    return repr(_first_line(text)) if text.strip() else "nothing"


def compare_outputs(got: list, expected: list) -> str | None:
    """None if ``got`` matches ``expected`` (nbval semantics, trailing whitespace stripped), else a one-line reason."""
    g, e = _comparable(got), _comparable(expected)
    for key in e:
        if key not in g:
            return f"output differs: expected {key} {_show(e[key])}, got no {key} output"
    for key in g:
        if key not in e:
            return f"output differs: unexpected {key} output {_show(g[key])}"
    for key in e:
        if len(g[key]) != len(e[key]):
            return f"output differs: expected {len(e[key])} {key} output(s), got {len(g[key])}"
        for gv, ev in zip(g[key], e[key]):
            if gv == ev:
                continue
            if isinstance(gv, str) and isinstance(ev, str):
                gl, el = gv.split("\n"), ev.split("\n")
                for i in range(max(len(gl), len(el))):
                    a = el[i] if i < len(el) else None
                    b = gl[i] if i < len(gl) else None
                    if a != b:
                        exp = repr(a) if a is not None else "no more lines"
                        got_ = repr(b) if b is not None else "no more lines"
                        return f"output differs ({key}, line {i + 1}): expected {exp}, got {got_}"
            return f"output differs ({key}): expected {_show([ev])}, got {_show([gv])}"
    return None
