"""The virtual cluster: PyTorch's real FSDP2 / DTensor code as one rank of a cluster of any
size, in one process (fake process group + FakeTensorMode + PyTorch's memory trackers).

* :func:`simulate_step` (simulate.py): per-rank memory of one training step -> a
  :class:`SimulatedStep` (result.py: typed fields, ``.to_frame()`` labelled "virtual").
* :func:`llama_like`, :class:`LlamaLike`, :data:`PRESETS` (model.py): Llama-shaped decoders
  with grouped-query attention, built only under fake mode; ``llama_like(shape)`` takes a
  ``course_lib.shape.ModelShape``.
* :func:`simulate_layout` (layout.py): ``simulate_step`` for a shape laid out as a
  ``plan.Layout`` (or a ``ParallelDims``) says.
* :func:`zero_figure1`, :func:`zero_7b_table`, :func:`model_states` (zero.py): the ZeRO paper's
  Figure 1 and the 7B-on-8-GPUs table, estimate beside the virtual cluster (a :class:`ZeroTable`).

Introduced in notebooks/10_zero_fsdp.ipynb; used in 11 and 14.
"""

from course_lib.virtual.layout import layout_arguments, simulate_layout
from course_lib.virtual.model import PRESETS, LlamaLike, llama_like
from course_lib.virtual.result import COLUMNS, LABEL, ROWS, SimulatedStep
from course_lib.virtual.simulate import STRATEGIES, simulate_step
from course_lib.virtual.zero import ZeroTable, model_states, zero_7b_table, zero_figure1

__all__ = [
    "simulate_step",
    "simulate_layout",
    "layout_arguments",
    "SimulatedStep",
    "ZeroTable",
    "STRATEGIES",
    "ROWS",
    "COLUMNS",
    "LABEL",
    "llama_like",
    "LlamaLike",
    "PRESETS",
    "zero_figure1",
    "zero_7b_table",
    "model_states",
]
