"""The one check the model configs share (``GPTConfig``, ``MLPConfig``, ``LlamaConfig``).

In a module of its own so that ``llama.py`` and the package front both import it and neither
imports the other (the front re-exports the Llama model).
"""

from __future__ import annotations

from typing import Any


def _check_pos_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}")
