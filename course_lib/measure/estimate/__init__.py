"""Every analytic formula the course uses, in one place, each with its source.

Notebooks predict with these functions and then measure; because every chapter calls the same
function, two chapters can never disagree about a number.

Units
-----
* Memory and traffic are in **bytes**. Results are ``int`` where the count is exact and a
  ``float`` only where a division does not come out even (said in each docstring).
* ``GB`` means 10**9 bytes (what papers and vendors quote), ``GiB`` means 2**30 bytes (what
  ``torch.cuda.memory_allocated`` style tools usually print). ``fmt_bytes`` says which it uses.
* Bandwidths are bytes per second unless a name ends in ``GBps`` (10**9 bytes per second).
* Times are seconds; FLOPs are floating-point operations (a multiply-add counts as 2).

This module imports nothing heavy (no torch), so it can be used anywhere, including in
planning cells that never touch a tensor. Introduced across the units; the memory formulas in
notebooks/01_backprop_memory.ipynb and notebooks/04_optimizer_memory.ipynb, the communication
formulas in notebooks/08_collectives.ipynb and notebooks/13_interconnects_and_backends.ipynb,
the roofline in notebooks/02_batch_size_and_accumulation.ipynb.

The formulas live in one module per topic, all importable as ``estimate.<name>``:
``units`` (byte units, formatting), ``memory`` (dtypes, model and optimizer state, ZeRO,
activations), ``communication`` (bytes each rank sends), ``links`` (alpha-beta time models,
link speeds, hierarchical all-reduce, DDP overlap), ``compute`` (FLOPs, roofline, bubble),
``offload`` (what offload keeps where, moves and costs per step), ``checkpointing`` (activation
bytes and recomputed FLOPs per checkpointing policy), ``lora`` (LoRA parameter counts, NF4
bytes, fine-tuning memory), ``training`` (parameter counts, 6ND, MFU, GPUs for a run,
accelerator specs, memory tiers, learning rate against the batch) and ``tensor_parallel``
(activations, parameters and communication per rank under tensor and sequence parallelism).
"""

from __future__ import annotations

from course_lib.measure.estimate import (  # noqa: E402
    activations,
    checkpointing,
    communication,
    compute,
    links,
    lora,
    memory,
    offload,
    planning,
    tensor_parallel,
    training,
    units,
    zero,
)
from course_lib.measure.estimate.activations import *  # noqa: F401,F403
from course_lib.measure.estimate.checkpointing import *  # noqa: F401,F403
from course_lib.measure.estimate.communication import *  # noqa: F401,F403
from course_lib.measure.estimate.compute import *  # noqa: F401,F403
from course_lib.measure.estimate.links import *  # noqa: F401,F403
from course_lib.measure.estimate.lora import *  # noqa: F401,F403
from course_lib.measure.estimate.memory import *  # noqa: F401,F403
from course_lib.measure.estimate.offload import *  # noqa: F401,F403
from course_lib.measure.estimate.planning import *  # noqa: F401,F403
from course_lib.measure.estimate.tensor_parallel import *  # noqa: F401,F403
from course_lib.measure.estimate.training import *  # noqa: F401,F403
from course_lib.measure.estimate.units import *  # noqa: F401,F403
from course_lib.measure.estimate.units import exact  # noqa: F401
from course_lib.measure.estimate.zero import *  # noqa: F401,F403

__all__ = [
    *units.__all__,
    *memory.__all__,
    *zero.__all__,
    *activations.__all__,
    *communication.__all__,
    *links.__all__,
    *compute.__all__,
    *offload.__all__,
    *checkpointing.__all__,
    *lora.__all__,
    *training.__all__,
    *tensor_parallel.__all__,
    *planning.__all__,
]
