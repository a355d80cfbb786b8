"""Parity of the from-scratch collectives with torch.distributed, on 2, 3 and 4 real gloo ranks.

Each world size is launched once and runs every case inside the ranks (process start-up dominates
the cost on 2 cores); the assertions happen here, in the parent, so failures read well.

Tolerance. The ring sums each chunk in a different rank order than gloo, and floating-point
addition is not associative, so results may differ in the last bits. The classic bound for a sum
of N terms computed in any order is |error| <= (N-1) * eps * sum_i |x_i| (Higham, "Accuracy and
Stability of Numerical Algorithms", 2nd ed., section 4.2); we compare each element against twice
that bound, with eps of the dtype under test. Inputs made of small integers are summed exactly in
every order, and there we require bitwise equality.
"""
from __future__ import annotations

import torch

NUMELS = (1, 7, 1001)
DTYPES = (torch.float32, torch.float64)
