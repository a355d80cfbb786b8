"""The virtual cluster names the sequence length ``seq``, as ``course_lib.shape.ModelShape`` does;
``seq_len``, its old name, is kept one release by ``simulate_step`` and ``zero_table``. No
simulation runs here: ``launch`` is replaced by one that records the checked spec and stops."""

from __future__ import annotations

import pytest

import course_lib.runtime.launch as launch_module
from course_lib import virtual
from course_lib.virtual import zero

EVEN = virtual.llama_like(2, 256, 8, 4, 512, 1024, name="even")


class Stopped(Exception):
    """Raised by the recording launch: the spec was checked and handed over."""


@pytest.fixture
def launched(monkeypatch):
    """The SimSpecs simulate_step handed to launch (no process starts)."""
    specs = []

    def record(fn, world_size, spec, **kwargs):
        specs.append(spec)
        raise Stopped

    monkeypatch.setattr(launch_module, "launch", record)
    return specs


def _simulate(**kwargs):
    with pytest.raises(Stopped):
        virtual.simulate_step(EVEN, world_size=8, strategy="fsdp", batch=2, **kwargs)


def test_simulate_step_takes_seq_and_its_old_name_for_one_release(launched):
    _simulate(seq=48)
    _simulate(seq_len=48)
    new, old = launched
    assert new.seq == old.seq == 48 and new == old  # the same spec either way
    assert "seq_len" not in type(new).__dataclass_fields__  # one name inside


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(seq=8, seq_len=8), TypeError, "seq = 8, seq_len = 8: expected seq alone"),
        (dict(), TypeError, r"seq = None: expected the tokens per sequence"),
        (dict(seq=0), ValueError, "seq = 0: expected an int >= 1"),
        (dict(seq_len=0), ValueError, "seq_len = 0: expected an int >= 1"),  # the name given
        (dict(seq_len="64"), TypeError, "seq_len = '64': expected an int"),
    ],
)
def test_bad_or_doubled_sequence_lengths_are_refused_before_any_process(
    launched, kwargs, error, message
):
    with pytest.raises(error, match=message):
        virtual.simulate_step(EVEN, world_size=8, strategy="fsdp", batch=2, **kwargs)
    assert launched == []


def test_zero_table_takes_seq_its_default_and_its_old_name(launched):
    for kwargs, expected in ((dict(seq=32), 32), (dict(seq_len=16), 16), (dict(), 64)):
        with pytest.raises(Stopped):  # stage 0 is the first to run on the virtual cluster
            zero.zero_table(EVEN, 8, [1.0, 1.0, 1.0, 1.0], paper_n_params=1e9, **kwargs)
        assert launched.pop().seq == expected
    with pytest.raises(TypeError, match="seq = 32, seq_len = 32: expected seq alone"):
        zero.zero_table(
            EVEN, 8, [1.0] * 4, paper_n_params=1e9, run_virtual=False, seq=32, seq_len=32
        )
    assert launched == []
