"""Unit 14's experiment that runs under torchrun: the 3-D run (``python -m course_lib.cluster list``)."""

from __future__ import annotations

from course_lib import validate
from course_lib.cluster import Experiment


def run_3d(
    world_size: int,
    *,
    dp: int = 2,
    tp: int = 2,
    pp: int = 2,
    steps: int = 2,
    batch: int = 8,
    microbatches: int = 2,
    seed: int = 0,
):
    """The tiny GPT trained on dp x tp x pp ranks (``course_lib.plan.three_d.run_3d``), stored
    as its dict (``Run3D.as_dict``; ``three_d.Run3D.from_dict(res.value)`` is the run again);
    check it with ``three_d.parity_3d``, read it with ``three_d.memory_table`` / ``comm_table``."""
    from course_lib.plan import three_d

    run = three_d.run_3d(dp, tp, pp, steps, batch=batch, microbatches=microbatches, seed=seed)
    return run.as_dict()


def _as_stored(value):
    """A run as the results file holds it: a ``Run3D`` as its dict, a dict as it is (so a run
    made here compares with one loaded from a file)."""
    from course_lib.plan.three_d_result import Run3D

    return value.as_dict() if isinstance(value, Run3D) else value


def _layout_fits(world_size: int, settings: dict) -> None:
    from course_lib.parallel.tensor import check_tp
    from course_lib.plan import three_d

    config = three_d.tiny_config()
    dp, tp, pp = settings["dp"], settings["tp"], settings["pp"]
    validate.count("microbatches", settings["microbatches"], minimum=1)
    if config.n_layer % pp:
        raise ValueError(f"pp = {pp}: expected a divisor of n_layer = {config.n_layer}")
    if settings["batch"] % (dp * settings["microbatches"]):
        raise ValueError(
            f"batch = {settings['batch']}: expected a multiple of dp x microbatches "
            f"= {dp * settings['microbatches']}"
        )
    check_tp(config, tp)


EXPERIMENTS = [
    Experiment(
        "u14.run_3d",
        "the tiny GPT on dp x tp x pp ranks (the 3-D run)",
        run_3d,
        "notebooks/14_planning_a_run.ipynb",
        plot="from course_lib.plan import three_d; three_d.parity_3d(three_d.Run3D.from_dict(res.value))",
        world_size=lambda s: s["dp"] * s["tp"] * s["pp"],
        check=_layout_fits,
        minimum=1,
        # A rank's peak can differ by one message between two runs: the pipeline frees a sent
        # gradient as soon as its isend completes, and when that is depends on the other rank.
        varying=("peak_bytes",),
        canonical=_as_stored,
    ),
]
