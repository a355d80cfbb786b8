"""Unit 19's measured runs (notebooks/19_inside_the_step.ipynb): inside one training step.

Each section lives in its own file and is re-exported here, so the notebook calls ``unit.run.x``:

- ``run_profile``: one GPT step under ``torch.profiler`` (operators, timeline, trace file), its
  memory over time (``MemoryMeter``), a DDP step on 2 gloo ranks with its bucket all-reduces
  found in the trace and split into hidden and exposed time;
- ``run_roofline``: this machine's matmul FLOP/s and copy bandwidth, each operator of a GPT block
  predicted from its FLOPs and bytes and measured under the profiler; an H100's datasheet roofs;
- ``run_fusion``: bias + GELU + dropout + residual + LayerNorm, bytes counted, eager against
  ``torch.compile``, and the C++ loop inductor generated;
- ``run_flash``: the online softmax step by step, ``techniques.flash`` at parity with
  ``F.scaled_dot_product_attention``, its memory against the written-out attention, Dao et al.'s
  Theorem 2 at an H100's SRAM, and a Llama 3 405B layer's attention memory at 8K and 128K.
"""

from __future__ import annotations

from course_lib.units.u19_inside_the_step.run_flash import (
    attention_memory,
    llama405b_attention,
    memory_sweep,
    online_softmax_steps,
    parity_table,
    theorem2,
)
from course_lib.units.u19_inside_the_step.run_fusion import (
    chain_inputs,
    compiler,
    eager_vs_compiled,
    fused_chain,
    fused_loop,
    fusion_bytes,
)
from course_lib.units.u19_inside_the_step.run_profile import (
    comm_table,
    ddp_step_profiles,
    gpt_matmul_flops,
    gpt_setup,
    gpt_step_memory,
    gpt_step_profile,
)
from course_lib.units.u19_inside_the_step.run_roofline import (
    H100,
    block_ops,
    machine_roofs,
    measure_ops,
    op_cost,
    op_table,
    roofline,
)

__all__ = [
    "attention_memory",
    "llama405b_attention",
    "memory_sweep",
    "online_softmax_steps",
    "parity_table",
    "theorem2",
    "chain_inputs",
    "compiler",
    "eager_vs_compiled",
    "fused_chain",
    "fused_loop",
    "fusion_bytes",
    "comm_table",
    "ddp_step_profiles",
    "gpt_matmul_flops",
    "gpt_setup",
    "gpt_step_memory",
    "gpt_step_profile",
    "H100",
    "block_ops",
    "machine_roofs",
    "measure_ops",
    "op_cost",
    "op_table",
    "roofline",
]
