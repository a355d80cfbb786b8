"""Reduced and mixed precision: bit layouts, dynamic loss scaling, and one training step per recipe.

Introduced in notebooks/03_mixed_precision.ipynb.

* :func:`bit_layout` reads the sign / exponent / mantissa split, range and precision of a float
  format from ``torch.finfo`` (never from a hand-typed table), for fp32, fp16, bf16 and the two
  fp8 formats (e4m3 and e5m2, Micikevicius et al. 2022, arXiv:2209.05433).
* :class:`DynamicLossScaler` is a from-scratch reference of the dynamic loss scaling of
  Micikevicius et al. 2017 (arXiv:1710.03740, Sec. 3.2) with the same rules and defaults as
  ``torch.amp.GradScaler``: multiply the loss by ``scale``; if any gradient is inf/NaN skip the
  step and halve the scale, otherwise grow it by 2x after ``growth_interval`` clean steps.
* :func:`prepare` and :func:`train_step` run one training step in each recipe of
  :data:`MODES` with the official APIs (``torch.autocast``, ``torch.amp.GradScaler``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, overload

import torch

from course_lib import validate
from course_lib.measure import estimate

__all__ = [
    "FORMATS",
    "MODES",
    "BitLayout",
    "bit_layout",
    "bit_string",
    "round_trip",
    "DynamicLossScaler",
    "prepare",
    "make_scaler",
    "train_step",
    "StepResult",
]

#: float formats of the unit, by short name -> torch dtype
FORMATS: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e5m2": torch.float8_e5m2,
    "fp8_e4m3": torch.float8_e4m3fn,
}

#: training recipes accepted by :func:`prepare` / :func:`train_step`
#: (the same names as ``course_lib.measure.estimate.PRECISIONS``)
MODES = estimate.PRECISIONS  # one table of precisions for the whole course


def _dtype(fmt: str | torch.dtype, name: str = "fmt") -> torch.dtype:
    if isinstance(fmt, torch.dtype):
        if fmt not in FORMATS.values():
            raise ValueError(
                f"{name} = {fmt!r}: expected one of {', '.join(map(str, FORMATS.values()))}"
            )
        return fmt
    if isinstance(fmt, str) and fmt.lower() in FORMATS:
        return FORMATS[fmt.lower()]
    raise ValueError(f"{name} = {fmt!r}: expected one of {', '.join(FORMATS)}")


def _mode(mode: Any) -> str:
    chosen: str = validate.choice("mode", mode, MODES)
    return chosen


# --------------------------------------------------------------------------------------------
# bit layouts
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BitLayout:
    """Layout, range and precision of one float format, all read from ``torch.finfo``."""

    name: str  # short name, e.g. "bf16"
    dtype: torch.dtype  # the torch dtype
    bits: int  # total bits
    exponent_bits: int  # bits of the biased exponent
    mantissa_bits: int  # stored fraction bits (the leading 1 is implicit)
    max: float  # largest finite value
    smallest_normal: float  # 2**(1 - bias): below this, values lose precision (subnormals)
    smallest_subnormal: float  # smallest positive value; anything below rounds to 0 (underflow)
    eps: float  # gap between 1.0 and the next value: 2**-mantissa_bits
    decimal_digits: float  # about log10(2**(mantissa_bits + 1)) significant decimal digits

    def as_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["dtype"] = str(self.dtype)
        return d


def bit_layout(fmt: str | torch.dtype) -> BitLayout:
    """The :class:`BitLayout` of ``fmt`` (a name of :data:`FORMATS` or a torch dtype).

    Derivation from ``torch.finfo``: ``eps = 2**-m`` gives the mantissa bits m; the sign takes
    one bit, the exponent the rest. The smallest subnormal is ``smallest_normal * eps``.
    """
    dtype = _dtype(fmt)
    name = next(k for k, v in FORMATS.items() if v == dtype)
    fi = torch.finfo(dtype)
    mantissa = int(round(-math.log2(fi.eps)))
    return BitLayout(
        name=name,
        dtype=dtype,
        bits=fi.bits,
        exponent_bits=fi.bits - 1 - mantissa,
        mantissa_bits=mantissa,
        max=float(fi.max),
        smallest_normal=float(fi.smallest_normal),
        smallest_subnormal=float(fi.smallest_normal) * float(fi.eps),
        eps=float(fi.eps),
        decimal_digits=(mantissa + 1) * math.log10(2),
    )


_INT_VIEW = {8: torch.uint8, 16: torch.int16, 32: torch.int32}


def bit_string(x: float, fmt: str | torch.dtype) -> str:
    """The bits of ``x`` rounded to ``fmt``, as ``"sign|exponent|mantissa"``.

    >>> bit_string(1.0, "bf16")
    '0|01111111|0000000'
    """
    layout = bit_layout(fmt)
    t = torch.tensor([float(x)], dtype=torch.float32).to(layout.dtype)
    raw = int(t.view(_INT_VIEW[layout.bits]).item()) & ((1 << layout.bits) - 1)
    s = format(raw, f"0{layout.bits}b")
    e = layout.exponent_bits
    return f"{s[0]}|{s[1 : 1 + e]}|{s[1 + e :]}"


@overload
def round_trip(x: float, fmt: str | torch.dtype) -> float: ...
@overload
def round_trip(x: torch.Tensor, fmt: str | torch.dtype) -> torch.Tensor: ...
def round_trip(x: float | torch.Tensor, fmt: str | torch.dtype) -> float | torch.Tensor:
    """``x`` rounded to ``fmt`` (round to nearest even) and read back as fp32/float."""
    dtype = _dtype(fmt)
    if isinstance(x, torch.Tensor):
        return x.to(dtype).to(torch.float32)
    return float(torch.tensor([float(x)], dtype=torch.float32).to(dtype).float().item())


# --------------------------------------------------------------------------------------------
# dynamic loss scaling, by hand
# --------------------------------------------------------------------------------------------
@dataclass
class DynamicLossScaler:
    """Dynamic loss scaling written out (reference for the exercise of notebook 03).

    Same rules and defaults as ``torch.amp.GradScaler`` (torch/amp/grad_scaler.py):

    * ``scale(loss)`` returns ``loss * scale``, so small gradients land in fp16's range;
    * ``unscale_(params)`` divides every ``.grad`` by ``scale`` (in fp32) and returns whether any
      is inf or NaN;
    * ``step(optimizer, params)`` unscales, then skips ``optimizer.step()`` if inf/NaN was found;
    * ``update(found_inf)``: on inf/NaN ``scale *= backoff_factor`` and the clean-step counter
      resets; after ``growth_interval`` clean steps in a row ``scale *= growth_factor``.
    """

    init_scale: float = 2.0**16  # starting scale (GradScaler default)
    growth_factor: float = 2.0  # multiply after growth_interval clean steps
    backoff_factor: float = 0.5  # multiply after a step with inf/NaN gradients
    growth_interval: int = 2000  # clean steps in a row before growing
    scale_value: float = field(init=False)
    growth_tracker: int = field(init=False, default=0)  # clean steps since the last change
    steps: int = field(init=False, default=0)  # update() calls
    skipped_steps: int = field(init=False, default=0)  # steps skipped for inf/NaN

    def __post_init__(self) -> None:
        validate.number("init_scale", self.init_scale, positive=True)
        if not validate.number("growth_factor", self.growth_factor) > 1:
            raise ValueError(f"growth_factor = {self.growth_factor!r}: expected a number > 1")
        if not 0 < validate.number("backoff_factor", self.backoff_factor) < 1:
            raise ValueError(
                f"backoff_factor = {self.backoff_factor!r}: expected a number in (0, 1)"
            )
        validate.count("growth_interval", self.growth_interval, minimum=1)
        self.scale_value = float(self.init_scale)

    def get_scale(self) -> float:
        return self.scale_value

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale_value

    def unscale_(self, params: Iterable[torch.Tensor]) -> bool:
        """Divide each ``p.grad`` by the scale in place (math in fp32); True if any is inf/NaN."""
        found_inf = False
        inv = 1.0 / self.scale_value
        for p in params:
            if p.grad is None:
                continue
            g = p.grad.float() * inv
            found_inf |= not bool(torch.isfinite(g).all())
            p.grad.copy_(g)  # back to the grad's own dtype
        return found_inf

    def update(self, found_inf: bool) -> float:
        """Back off on inf/NaN, grow after ``growth_interval`` clean steps; returns the new scale."""
        self.steps += 1
        if found_inf:
            self.skipped_steps += 1
            self.scale_value *= self.backoff_factor
            self.growth_tracker = 0
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.growth_tracker = 0
        return self.scale_value

    def step(self, optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor]) -> bool:
        """Unscale, step unless inf/NaN, update the scale. Returns True if the step was skipped."""
        found_inf = self.unscale_(params)
        if not found_inf:
            optimizer.step()
        self.update(found_inf)
        return found_inf


# --------------------------------------------------------------------------------------------
# one training step per recipe
# --------------------------------------------------------------------------------------------
def prepare(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """Put ``model`` in the storage dtype of ``mode`` (in place; returns it).

    ``bf16-true`` casts the parameters to bf16 (no fp32 copy anywhere, the optimizer state is
    created in bf16 too). The other recipes keep fp32 parameters: ``torch.autocast`` casts
    copies per op, and those fp32 parameters double as the "master weights".
    """
    _mode(mode)
    if mode == "bf16-true":
        model.to(torch.bfloat16)
    return model


def make_scaler(
    mode: str, device: str | torch.device = "cpu", **kwargs: Any
) -> torch.amp.GradScaler | None:
    """A ``torch.amp.GradScaler`` for ``fp16-mixed``; None for the other recipes
    (bf16 has fp32's exponent range, so its gradients do not underflow)."""
    if _mode(mode) != "fp16-mixed":
        return None
    return torch.amp.GradScaler(torch.device(device).type, **kwargs)


@dataclass(frozen=True)
class StepResult:
    loss: float  # the unscaled loss, as a Python float
    skipped: bool  # the optimizer step was skipped (inf/NaN gradients under fp16 loss scaling)
    scale: float  # the loss scale used for this step (1.0 without a scaler)


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loss_fn: Callable[[torch.nn.Module], torch.Tensor],
    *,
    mode: str,
    scaler: Any = None,
) -> StepResult:
    """One forward/backward/step of ``loss_fn(model)`` in recipe ``mode``.

    * ``fp32``: plain.
    * ``bf16-mixed`` / ``fp16-mixed``: forward under ``torch.autocast(dtype=bf16/fp16)``,
      backward outside it (autograd runs each op's backward in its forward's dtype).
      ``fp16-mixed`` needs a ``torch.amp.GradScaler`` (:func:`make_scaler`) or a
      :class:`DynamicLossScaler`; without one, small gradients underflow to zero.
    * ``bf16-true``: the model was cast by :func:`prepare`; no autocast, no scaler.
    """
    _mode(mode)
    if mode == "fp16-mixed" and scaler is None:
        raise ValueError(
            "scaler = None: expected make_scaler('fp16-mixed') (or a DynamicLossScaler) with "
            "mode='fp16-mixed': without one, small gradients underflow to zero"
        )
    device_type = next(model.parameters()).device.type
    optimizer.zero_grad(set_to_none=True)
    if mode in ("bf16-mixed", "fp16-mixed"):
        dtype = torch.bfloat16 if mode == "bf16-mixed" else torch.float16
        with torch.autocast(device_type=device_type, dtype=dtype):
            loss = loss_fn(model)
    else:
        loss = loss_fn(model)
    if scaler is None:
        loss.backward()
        optimizer.step()
        return StepResult(loss=float(loss.detach().float()), skipped=False, scale=1.0)
    scale = float(scaler.get_scale())
    scaler.scale(loss.float()).backward()
    if isinstance(scaler, DynamicLossScaler):
        skipped = scaler.step(optimizer, [p for g in optimizer.param_groups for p in g["params"]])
    else:
        scaler.step(optimizer)
        scaler.update()
        # GradScaler backs off exactly when it skipped the step
        skipped = float(scaler.get_scale()) < scale
    return StepResult(loss=float(loss.detach().float()), skipped=skipped, scale=scale)
