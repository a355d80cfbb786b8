"""course_lib.resilience on arguments it cannot take (issue 47): a state that is no mapping or
a path that names no folder is refused by ``save`` before its first barrier (so no rank waits
and no ``.partial`` folder is left behind), and by ``load``/``verify`` before any read."""

from __future__ import annotations

import pytest
import torch

from course_lib import resilience


def test_save_refuses_before_the_first_barrier(tmp_path):
    with pytest.raises(TypeError, match=r"^state = 42: expected a dict or an object with"):
        resilience.save(42, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []  # rank 0 had made ckpt.partial before the barrier
    for path in ("", ".", "/"):
        with pytest.raises(ValueError, match=rf"^path = '{path}': expected a checkpoint folder"):
            resilience.save({"w": torch.zeros(2)}, path)
    with pytest.raises(TypeError, match=r"^path = 5: expected a folder \(str or PathLike\)"):
        resilience.save({"w": torch.zeros(2)}, 5)
    assert resilience.save({"w": torch.ones(2)}, tmp_path / "ok") == tmp_path / "ok"


def test_load_refuses_a_path_that_is_no_folder(tmp_path):
    with pytest.raises(TypeError, match=r"^path = None: expected a folder"):
        resilience.load({"w": torch.zeros(2)}, None)
    with pytest.raises(ValueError, match=r"^path = '': expected a checkpoint folder"):
        resilience.verify({"w": torch.zeros(2)}, "")
