"""Unit 12's graded checks: a correct answer passes, a wrong one fails with a ✗ line, one that
calls the course's own answer is refused; under two grading seeds, and an answer copied from
seed 0's cases fails under another."""

from __future__ import annotations

import pytest
from _grading_seeds import FIXTURE_SEEDS  # seed 0: tests/_grading_seeds.py

from course_lib.units.u12_pipeline_parallelism import _cases as K
from course_lib.units.u12_pipeline_parallelism import checks as C

SEEDS = ("0", "7")


@pytest.fixture(params=FIXTURE_SEEDS)
def seed(request, monkeypatch):
    monkeypatch.setenv("COURSE_GRADE_SEED", request.param)
    return request.param


# ---- task 1 --------------------------------------------------------------------------------
def good_bubble(layers, m):
    p, total = len(layers), sum(layers)
    return 1 - m * total / (p * (total + (m - 1) * max(layers)))


def equal_stage_bubble(layers, m):  # the lecture's formula: ignores the bottleneck stage
    p = len(layers)
    return (p - 1) / (m + p - 1)


def course_bubble(layers, m):
    from course_lib.measure import estimate

    return estimate.pipeline_bubble_fraction(len(layers), m)


def test_bubble_check(seed, capsys):
    C.check_bubble_prediction(good_bubble)
    assert capsys.readouterr().out == (
        "✓ task 1: GPipe's idle fraction with uneven stages matches its order on 3 ranks "
        "replayed on ideal hardware (2 drawn pipelines)\n"
    )
    with pytest.raises(
        AssertionError, match=r"✗ task 1: layers per stage \[.*\], m = \d+: you predicted"
    ):
        C.check_bubble_prediction(equal_stage_bubble)
    with pytest.raises(
        AssertionError, match="✗ task 1: uses the course's own pipeline_bubble_fraction"
    ):
        C.check_bubble_prediction(course_bubble)
    with pytest.raises(AssertionError, match="must return a finite float, got str"):
        C.check_bubble_prediction(lambda layers, m: "0.2")


@pytest.mark.slow
def test_the_judge_replays_the_order_a_real_run_records(seed):
    """The judge replays ``schedule_order`` instead of starting ranks: on 3 real ranks, each rank
    runs exactly that order, for every drawn pipeline."""
    from course_lib.measure.timing import merge_event_logs
    from course_lib.parallel import pipeline as P
    from course_lib.runtime.launch import launch
    from course_lib.units.u12_pipeline_parallelism.checks_bubble import _bubble_worker
    from course_lib.units.u12_pipeline_parallelism.run import _recorded_orders

    cases = K.bubble_cases(1)
    runs = launch(_bubble_worker, K.BUBBLE_RANKS, cases, timeout=120)
    for i, case in enumerate(cases):
        recorded = _recorded_orders(merge_event_logs([r[i] for r in runs]), K.BUBBLE_RANKS)
        m = case["microbatches"]
        assert recorded == [
            P.schedule_order("gpipe", r, K.BUBBLE_RANKS, m) for r in range(K.BUBBLE_RANKS)
        ]


def test_bubble_cases_are_uneven_and_one_never_fills(seed):
    few, many = K.bubble_cases(1)
    assert len(set(few["sizes"])) > 1 and len(set(many["sizes"])) > 1
    assert few["microbatches"] <= K.BUBBLE_RANKS < many["microbatches"]


def test_copied_bubbles_fail_under_another_seed(monkeypatch):
    table = [good_bubble(c["sizes"], c["microbatches"]) for c in K.bubble_cases(1)]
    answers = {(tuple(c["sizes"]), c["microbatches"]): t for c, t in zip(K.bubble_cases(1), table)}

    def copied(layers, m):
        return answers.get((tuple(layers), m), table[0])

    C.check_bubble_prediction(copied)
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 1: layers per stage"):
        C.check_bubble_prediction(copied)


# ---- task 2 --------------------------------------------------------------------------------
def good_replay(orders, layers):
    n = len(layers)
    done, pos, free = {}, [0] * len(orders), [0.0] * len(orders)
    starts = [[] for _ in orders]
    while any(pos[r] < len(o) for r, o in enumerate(orders)):
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                kind, mb, k = order[pos[r]]
                if kind == "F":
                    dep = ("F", k - 1, mb) if k > 0 else None
                else:
                    dep = ("B", k + 1, mb) if k < n - 1 else ("F", k, mb)
                if dep is not None and dep not in done:
                    break
                start = max(free[r], done[dep] if dep else 0.0)
                free[r] = done[(kind, k, mb)] = start + layers[k] * (1 if kind == "F" else 2)
                starts[r].append(start)
                pos[r] += 1
    return starts


def unit_cost_replay(orders, layers):  # every stage costs one layer: ignores the uneven split
    return good_replay(orders, [1] * len(layers))


def course_replay(orders, layers):
    from course_lib.parallel import pipeline as P

    spans = P.replay(orders, P.split_layers(sum(layers), len(layers), sizes=layers))
    return [[s["start"] for s in spans if s["rank"] == r] for r in range(len(orders))]


def test_replay_check(seed, capsys):
    C.check_replay(good_replay)
    assert capsys.readouterr().out.startswith("✓ task 2: replayed start times match")
    with pytest.raises(
        AssertionError, match=r"✗ task 2: .*rank \d's action \d+ \([FB]\d+ of stage"
    ):
        C.check_replay(unit_cost_replay)
    with pytest.raises(AssertionError, match="✗ task 2: uses the course's own replay"):
        C.check_replay(course_replay)
    with pytest.raises(AssertionError, match="expected a list per rank of"):
        C.check_replay(lambda orders, layers: [0.0])


def test_replay_cases_cover_every_schedule(seed):
    cases = K.replay_cases(2)
    assert sorted(c["schedule"] for c in cases) == ["1f1b", "gpipe", "interleaved"]
    for c in cases:
        assert len(c["layers"]) == c["ranks"] * c["virtual"] and len(set(c["layers"])) > 1


def test_copied_start_times_fail_under_another_seed(monkeypatch):
    table = iter([good_replay(C._orders(c), c["layers"]) for c in K.replay_cases(2)] * 2)
    C.check_replay(lambda orders, layers: next(table))
    monkeypatch.setenv("COURSE_GRADE_SEED", "7")
    with pytest.raises(AssertionError, match="✗ task 2: "):
        C.check_replay(lambda orders, layers: next(table))


# ---- task 3 --------------------------------------------------------------------------------
def good_holder(stage, ranks):
    chunk, pos = divmod(stage, ranks)
    return pos if chunk % 2 == 0 else ranks - 1 - pos


def buggy_holder(stage, ranks):  # the exercise's: right for two chunks only
    chunk, pos = divmod(stage, ranks)
    return pos if chunk == 0 else ranks - 1 - pos


def course_holder(stage, ranks):
    from course_lib.parallel.pipeline import stage_owner

    return stage_owner(stage, ranks)


def torch_holder(stage, ranks):
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    return generate_stage_to_rank_mapping(ranks, 4 * ranks, style="v")[stage]


def test_the_v_is_torchs_v():
    """The check's V is torch's: its ZB-V and DualPipeV schedules place two chunks per rank so,
    and its placement helper extends the pattern to any number of chunks."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    assert C._v_walk(1, 3) == [0, 0, 0]
    for p in (2, 3, 4, 8):
        for v in (1, 2, 3, 4):
            mapping = generate_stage_to_rank_mapping(p, v * p, style="v")
            assert C._v_walk(p, v * p) == [mapping[k] for k in range(v * p)]


def test_holder_check(seed, capsys):
    C.check_holder(good_holder)
    assert capsys.readouterr().out.startswith("✓ task 3: stages placed in a V")
    with pytest.raises(
        AssertionError,
        match="✗ task 3: stage 4 with 2 ranks \\(chunk 2, counting from 0\\): your function "
        "places it on rank 1, off the V",
    ) as err:
        C.check_holder(buggy_holder)
    assert "% 2" not in str(err.value) and "down" not in str(err.value)
    with pytest.raises(AssertionError, match="✗ task 3: stage 2 with 2 ranks .* on rank 0"):
        C.check_holder(lambda k, p: k % p)  # section 2's round robin is not a V
    with pytest.raises(AssertionError, match="✗ task 3: uses the course's own stage_owner"):
        C.check_holder(course_holder)
    with pytest.raises(
        AssertionError, match="✗ task 3: uses the course's own generate_stage_to_rank_mapping"
    ):
        C.check_holder(torch_holder)
    with pytest.raises(AssertionError, match="✗ task 3: stage 0 with 2 ranks: rank 2 does not"):
        C.check_holder(lambda k, p: p)
    with pytest.raises(AssertionError, match="must return an int rank, got float"):
        C.check_holder(lambda k, p: float(good_holder(k, p)))


@pytest.mark.parametrize("holder", [good_holder, buggy_holder, course_holder])
def test_the_v_steps_messages_are_counted_on_the_wire(holder):
    """The real step counts the sends it makes (a hand-off inside a rank is none); they match
    the stage boundaries the placement puts across ranks, which differ between placements."""
    case = {"virtual": 3, "microbatches": 2, "seed": 0}
    runs = C._launch(3, C._holder_worker, 2, holder, case)
    sent = sum(n for _, n in runs)
    assert sent == C._v_messages([holder(k, 2) for k in range(6)], 2)
    assert (sent == C._v_messages(C._v_walk(2, 6), 2)) == (holder is good_holder)


def test_holder_step_is_drawn(monkeypatch):
    drawn = set()
    for s in ("0", "1", "2", "3", "7"):
        monkeypatch.setenv("COURSE_GRADE_SEED", s)
        case = K.holder_case(3)
        drawn.add((case["virtual"], case["microbatches"]))
    assert len(drawn) > 1
