"""Which lost writes a default-mode power cut explains (raftkv/chaos/power_cuts.py)."""

from __future__ import annotations

from raftkv.chaos.history import Op
from raftkv.chaos.power_cuts import LOSS_BOUND_SECONDS, Cut, explain_losses


def add(value: int, acknowledged_at: float) -> Op:
    return Op(client=1, f="add", key="set", value=value, result=None, invoke=int((acknowledged_at - 0.01) * 1e9),
              complete=int(acknowledged_at * 1e9), status="ok")


def test_a_loss_acknowledged_within_the_bound_before_a_cut_or_during_it_is_explained():
    cuts = [Cut(start=100.0, end=103.0), Cut(start=200.0, end=201.0)]
    just_before, during, long_before = add(1, 99.5), add(2, 100.2), add(3, 100.0 - LOSS_BOUND_SECONDS - 0.1)
    after_every_cut = add(4, 250.0)
    losses = explain_losses([just_before, during, long_before, after_every_cut], cuts)
    assert losses.explained == (just_before, during)
    assert losses.unexplained == (long_before, after_every_cut)
    assert losses.worst_seconds == 0.5


def test_no_loss_is_nothing_to_explain():
    losses = explain_losses([], [Cut(1.0, 2.0)])
    assert losses.explained == losses.unexplained == () and losses.worst_seconds == 0.0
    assert "0 acknowledged adds lost" in losses.summary()
