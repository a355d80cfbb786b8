"""Tables in the stored lectures show figures, not Python's raw floats (issue 52, item 7).

A printed DataFrame of any lecture (a cell's table, or ``.to_string()`` printed) may hold no
float with pandas' six default decimals, fixed or scientific (``16.001034`` where the lecture
means 16 B/param, ``2.568886e-11`` where it means a parity error of ``2.6e-11``) and no ``NaN`` /
``None`` (where the lecture means "no such figure": ``—``, said in a note). Tables whose digits
are the lesson are listed in ``EXCEPTIONS`` with the reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LECTURES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

#: a float printed with exactly six decimals (pandas' default), fixed (``16.001034``) or in
#: scientific notation with six mantissa decimals (``2.568886e-11``, ``6.738416e+09``)
SIX_DECIMALS = re.compile(r"(?<![\w.])-?\d+\.\d{6}(?:e[+-]\d{2,3})?(?![\w.])")
#: a missing value as pandas or Python prints it
MISSING = re.compile(r"(?<![\w<])(?:NaN|nan|None|<NA>)(?![\w>])")

#: (lecture, a piece of the cell's source) -> why its table keeps its digits
EXCEPTIONS = {
    ("03_mixed_precision", "unit.run.format_table()"): "each format's constants from torch.finfo "
    "are the lesson: fp16's max 6.550400e+04 is 65504, e4m3's 4.480000e+02 is 448, eps 9.765625e-04 "
    "is 2^-10 exactly; two significant digits would turn them into 6.6e+04 and 0.00098",
    ("03_mixed_precision", "unit.run.rounding_table("): "the stored value of each format is the "
    "lesson: fp16's 1.000977 against 1.001, bf16's 9.994507e-04 against 1e-3 and 1.001172e-08 "
    "against 1e-8",
    ("03_mixed_precision", "unit.run.tiny_updates("): "small updates lost or kept: 1.100005 "
    "against 1.1 and 1.000000 (bf16 lost them all) need the sixth decimal; eps/2 of each "
    "storage (5.960464e-08 = 2^-24, 3.906250e-03 = 2^-8) is exact beside the update 0.001",
    ("03_mixed_precision", "unit.run.underflow_fractions("): "fractions of gradients that "
    "underflow: 0.000051 and 0.000423 after scaling are what scaling leaves",
    ("03_mixed_precision", "ms_per_step="): "first and last losses of four recipes agree to "
    "4-5 digits: the digits are the comparison (the time is rounded to 0.1 ms)",
    ("07_lora_qlora", "unit.run.memory_table("): "bytes per target parameter of NF4 with double "
    "quantization: 0.516276 is the exact count (4 bits + scale bits)",
    ("07_lora_qlora", "unit.run.nf4_table("): "exact NF4 byte counts per parameter (0.516276, "
    "0.515873) and bitsandbytes' error beside ours, equal to the sixth decimal",
    ("12_pipeline_parallelism", "unit.run.source_check("): "the sources' own figures "
    "(m/(m+p-1) = 0.727273 at p 4, m 8) checked at full precision, so a mismatch shows",
    ("14_planning_a_run", "three_d.parity_3d(run)"): "the 3-D run's loss beside one process's, "
    "equal to the sixth decimal: the digits are the parity (the memory table's ratio is rounded)",
}


def _source(cell: dict) -> str:
    return "".join(cell.get("source", ""))


def _printed_tables(cell: dict) -> list[str]:
    """The text of each DataFrame the cell shows: a table's plain text, or printed
    ``.to_string()`` output."""
    tables = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if 'class="dataframe"' in "".join(data.get("text/html", "")):
            tables.append("".join(data.get("text/plain", "")))
        elif out.get("output_type") == "stream" and ".to_string(" in _source(cell):
            tables.append("".join(out.get("text", "")))
    return tables


def raw_numbers(path: Path) -> list[str]:
    """``lecture cell i: what`` for each printed table of ``path`` showing a six-decimal float or
    a missing value, the cells in ``EXCEPTIONS`` left out."""
    found = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        if cell["cell_type"] != "code" or any(
            lecture == path.stem and piece in _source(cell) for lecture, piece in EXCEPTIONS
        ):
            continue
        for text in _printed_tables(cell):
            hits = SIX_DECIMALS.findall(text)[:3] + MISSING.findall(text)[:3]
            if hits:
                found.append(f"{path.stem} cell {i}: {', '.join(hits)}")
    return found


def test_the_scan_finds_six_decimals_and_missing_values():
    import pandas as pd

    table = pd.DataFrame(
        {
            "B/param": [16.001034, 8.0],
            "twin": pd.Series(["ZeRO", None], dtype=object),
            "x": [1.5, float("nan")],
        }
    )
    cell = {
        "cell_type": "code",
        "source": "table",
        "outputs": [
            {
                "output_type": "execute_result",
                "data": {"text/html": table.to_html(), "text/plain": repr(table)},
            }
        ],
    }
    text = _printed_tables(cell)[0]
    assert SIX_DECIMALS.findall(text) == ["16.001034", "8.000000"]
    assert sorted(MISSING.findall(text)) == ["NaN", "None"]
    assert SIX_DECIMALS.findall(repr(table.round({"B/param": 2}))) == []
    assert SIX_DECIMALS.findall("2.568886e-11 -6.738416e+09 1.797693e+308") == [
        "2.568886e-11",
        "-6.738416e+09",
        "1.797693e+308",
    ]
    kept = "2.6e-11 6.74e+09 0.0017 1,120.000000x 2.5688e-11 v1.000000e2"
    assert SIX_DECIMALS.findall(kept) == []
    sci = pd.DataFrame({"worst": [2.568886e-11, 0.0]})
    assert SIX_DECIMALS.findall(repr(sci)) == ["2.568886e-11", "0.000000e+00"]
    assert SIX_DECIMALS.findall(repr(sci.assign(worst=sci["worst"].map("{:.2g}".format)))) == []
    printed = {"cell_type": "code", "source": "print(t.to_string())", "outputs": []}
    printed["outputs"] = [{"output_type": "stream", "name": "stdout", "text": table.to_string()}]
    assert _printed_tables(printed) == [table.to_string()]
    printed["source"] = "print(t)"  # printed text, not a table
    assert _printed_tables(printed) == []


def test_every_exception_names_a_cell_that_exists():
    sources = {p.stem: [_source(c) for c in json.loads(p.read_text())["cells"]] for p in LECTURES}
    for lecture, piece in EXCEPTIONS:
        assert any(piece in s for s in sources[lecture]), (lecture, piece)


def test_stored_lecture_tables_show_rounded_figures_not_raw_floats_or_nan():
    assert len(LECTURES) == 20
    found = [hit for path in LECTURES for hit in raw_numbers(path)]
    assert found == [], "printed tables with raw floats or missing values:\n" + "\n".join(found)
