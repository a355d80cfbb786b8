"""Tables of a 3-D run (:func:`course_lib.plan.three_d.run_3d`): each rank's measured model
state beside the planner's prediction, and what each rank sent. Re-exported by ``three_d``.
Introduced in notebooks/14_planning_a_run.ipynb."""

from __future__ import annotations

import math

from course_lib.plan.specs import Layout

__all__ = ["memory_table", "comm_table"]

#: bytes per element the planner assumes (bf16 weights and grads, fp32 master + Adam moments)
#: and what the fp32 run on CPU holds (fp32 weights and grads, Adam's two moments)
_PLANNER_BYTES = {"params": 2, "grads": 2, "optimizer": 12}
_RUN_BYTES = {"params": 4, "grads": 4, "optimizer": 8}


def memory_table(result: dict):
    """Measured vs predicted model state per rank (one row per pipeline stage, tp rank 0 of dp
    replica 0; the other ranks of a stage measure the same). ``predict_memory`` counts
    mixed-precision bytes (2 + 2 + 12 per parameter); the run is fp32 with Adam (4 + 4 + 8), so
    both are also shown in elements: bytes / bytes per element. ``measured_optimizer`` includes
    Adam's scalar ``step`` counters (4 bytes per tensor)."""
    import pandas as pd

    from course_lib.plan.memory import predict_memory
    from course_lib.plan.three_d import tiny_spec

    lay = result["layout"]
    spec = tiny_spec(result["config"])
    layout = Layout(
        dp=lay["dp"], tp=lay["tp"], pp=lay["pp"], zero=0, recompute="none", sequence_parallel=False
    )
    rows = []
    for r in result["ranks"]:
        pp_rank, dp_rank, tp_rank = r["coords"]
        if dp_rank or tp_rank:
            continue
        which = "first" if pp_rank == 0 else "last"
        pred = predict_memory(spec, layout, stage=which if lay["pp"] > 1 else "worst")
        row = {"rank": r["rank"], "stage": pp_rank}
        for cat in ("params", "grads", "optimizer"):
            row[f"measured_{cat}"] = r["memory"][cat]
            row[f"predicted_{cat}"] = pred[cat]
        # MemoryMeter counts module buffers (causal masks, positions) as params: taken out
        row["measured_params_elems"] = (r["memory"]["params"] - r["buffer_bytes"]) // _RUN_BYTES[
            "params"
        ]
        row["predicted_params_elems"] = math.ceil(pred["params"] / _PLANNER_BYTES["params"])
        row["elems_ratio"] = row["measured_params_elems"] / row["predicted_params_elems"]
        rows.append(row)
    return pd.DataFrame(rows)


def comm_table(result: dict):
    """What each rank sent during training (CommMeter): calls, the pipeline's point-to-point
    payload, the modelled bytes of all calls and the bytes the OS saw it write (gloo over TCP;
    None where unavailable)."""
    import pandas as pd

    rows = []
    for r in result["ranks"]:
        c = r["comm"]
        rows.append(
            {
                "rank": r["rank"],
                "pp": r["coords"][0],
                "dp": r["coords"][1],
                "tp": r["coords"][2],
                "all_reduce": r["calls"].get("all_reduce", 0),
                "send": r["calls"].get("isend", 0),
                "recv": r["calls"].get("recv", 0),
                "p2p_bytes_sent": c["p2p_bytes_sent"],
                "model_bytes_sent": c["model_bytes_sent"],
                "wire_bytes_sent": c["wire_bytes_sent"],
            }
        )
    return pd.DataFrame(rows)
