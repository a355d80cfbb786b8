"""What the planner refuses before it searches, and what it can always search (issue 47, item 6):
a global batch too large to search in bounded time (10^8 sequences took 26 s, 10^12 never
answered), layouts no run could build (pp above the layers, a stage with no layer), and ``uneven_stages=True`` on every model it knows (DeepSeek-V3 raised: the search and
the checks counted the layers of a stage differently)."""

from __future__ import annotations

import time

import pytest

from course_lib import plan as P
from course_lib.plan import published, search

H100 = "8xH100 + 400G IB"
#: every model the planner ships: the presets and the models of the published runs
MODELS = {**P.MODELS, **{r.model.name: r.model for r in published.RUNS.values()}}


def _plan(model, gpus=8, sequences=1024, **kwargs):
    return P.plan(
        model, P.cluster(H100, gpus=gpus), global_batch_tokens=sequences * model.seq, **kwargs
    )


@pytest.mark.timeout(60)  # before the bound, 10^12 sequences never answered
@pytest.mark.parametrize("sequences", [search.MAX_BATCH_SEQUENCES + 1, 10**8, 10**12])
def test_a_global_batch_beyond_the_bound_is_refused_before_searching(sequences):
    m = P.model("Llama-2-7B")
    t0 = time.monotonic()
    with pytest.raises(ValueError) as info:
        _plan(m, sequences=sequences)
    assert time.monotonic() - t0 < 1.0
    assert str(info.value) == (
        f"global_batch_tokens = {sequences * 4096}: expected at most 10,000,000 sequences of "
        "seq = 4096 (40,960,000,000 tokens), the largest global batch the planner searches"
    )


def test_max_micro_batch_beyond_the_bound_is_refused():
    with pytest.raises(ValueError, match=r"^max_micro_batch = 65: expected an int in 1\.\.64$"):
        _plan(P.model("Llama-2-7B"), max_micro_batch=search.MAX_MICRO_BATCH + 1)


@pytest.mark.timeout(60)
def test_the_search_at_its_bounds_answers_in_seconds():
    m = P.model("Llama-2-7B")
    t0 = time.monotonic()
    result = _plan(m, sequences=search.MAX_BATCH_SEQUENCES, max_micro_batch=search.MAX_MICRO_BATCH)
    assert time.monotonic() - t0 < 20  # about 1 s on an idle core
    assert not result.empty and result.iloc[0].micro_batch <= search.MAX_MICRO_BATCH


def test_more_stages_than_layers_is_refused_everywhere():
    m = P.model("Llama-2-70B")  # 80 layers
    message = (
        r"^pp = 96: expected at most layers = 80 \(every pipeline stage holds at least one layer\)$"
    )
    layout = P.Layout(8, 1, 96)
    for uneven in (True, False):
        with pytest.raises(ValueError, match=message):
            P.stage_layers(m, 96, uneven_stages=uneven)
        with pytest.raises(ValueError, match=message):
            P.check_layout(m, layout, uneven_stages=uneven)
        with pytest.raises(ValueError, match=message):
            P.evaluate(m, P.cluster(H100, gpus=768), layout, global_batch_tokens=768 * 4096,
                       uneven_stages=uneven)  # fmt: skip
        with pytest.raises(ValueError, match=message):  # before any search
            _plan(m, gpus=768, sequences=768, uneven_stages=uneven, only={"pp": [96]})


@pytest.mark.parametrize(
    "only, message",
    [
        ({"pp": [3]}, r"^pp = 3: expected a divisor of layers = 32: one of 1, 2, 4, 8, 16, 32"),
        ({"tp": [3]}, r"^tp = 3: expected a divisor of heads = 32 and kv_heads = 32"),
        ({"cp": [3]}, r"^cp = 3: expected a divisor of seq = 4096$"),
        ({"ep": [2]}, r"^ep = 2: expected a divisor of the 0 experts \(a dense model: ep = 1\)$"),
        ({"zero": [4]}, r"^zero = 4: expected one of 0, 1, 2, 3$"),
        ({"v": [0]}, r"^virtual_stages = 0: expected an int >= 1$"),
    ],
)
def test_values_of_only_no_layout_can_have_are_refused_before_searching(only, message):
    with pytest.raises(ValueError, match=message):
        _plan(P.model("Llama-2-7B"), only=only)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_uneven_stages_never_leave_a_stage_without_a_layer(name):
    m = MODELS[name]
    for pp in range(1, m.layers + 1):
        n, last = P.stage_layers(m, pp, uneven_stages=True)
        # pp - 1 stages of at most n layers (the fullest n) and a last stage of 1..n layers
        assert 1 <= last <= n and pp - 1 <= m.layers - last <= (pp - 1) * n, (pp, n, last)
        assert pp == 1 or n == -(-(m.layers - last) // (pp - 1)), (pp, n, last)
        assert P.layers_per_stage(m, pp, uneven_stages=True) == n


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_layout_the_search_weighs_passes_the_checks(name):
    m = MODELS[name]
    tokens = 2048 * m.seq
    for gpus in (8, 2048):
        for uneven in (False, True):
            layouts = search.candidates(m, P.cluster(H100, gpus=gpus), gpus, tokens, uneven, 8,
                                        False, None)  # fmt: skip
            for layout in layouts:
                P.check_layout(m, layout, global_batch_tokens=tokens, uneven_stages=uneven)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_uneven_stages_work_on_every_model(name):
    m = MODELS[name]
    for gpus in (8, 512):
        result = _plan(m, gpus=gpus, sequences=512, uneven_stages=True,
                       only={"zero": [1], "recompute": ["selective"]})  # fmt: skip
        assert len(result) + len(result.attrs["rejected"]) > 0
        if not result.empty:
            assert result["step_s"].gt(0).all()
