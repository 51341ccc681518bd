"""The autoscaling decision as a plain function of the observed signals."""

from __future__ import annotations

import pytest

from conveyor.fleet.autoscale import Autoscaler, Signals


def busy(ready: int, rate: float, p95: float | None = None, age: float = 0.0,
         advice: int | None = None) -> Signals:
    return Signals(ready=ready, rate=rate, p95_wait=p95, backlog_age=age, saturated=True,
                   idle=False, advice=advice)


IDLE = Signals(ready=0, rate=0.0, p95_wait=None, backlog_age=0.0, saturated=False, idle=True)


def test_a_burst_reaches_the_maximum_in_one_decision() -> None:
    scaler = Autoscaler(1, 4, target_wait=2.0)
    decision = scaler.decide(1, busy(ready=600, rate=10.0), now=100.0)
    assert decision is not None and (decision.before, decision.after) == (1, 4)
    assert "60.0 s" in decision.reason and decision.action == "scale out"


def test_steps_are_proportional_to_the_excess_wait() -> None:
    scaler = Autoscaler(1, 10, target_wait=2.0)
    decision = scaler.decide(2, busy(ready=30, rate=10.0), now=0.0)  # 3 s projected
    assert decision is not None and decision.after == 3


def test_no_scale_out_while_waits_stay_under_the_target() -> None:
    scaler = Autoscaler(1, 4, target_wait=2.0)
    assert scaler.decide(1, busy(ready=15, rate=10.0, p95=0.5), now=0.0) is None


def test_observed_p95_wait_alone_scales_out() -> None:
    scaler = Autoscaler(1, 4, target_wait=2.0)
    decision = scaler.decide(2, busy(ready=5, rate=10.0, p95=5.0), now=0.0)
    assert decision is not None and decision.after == 4


def test_without_a_finishing_rate_the_backlog_age_counts() -> None:
    scaler = Autoscaler(1, 4, target_wait=2.0)
    assert scaler.decide(1, busy(ready=50, rate=0.0, age=1.0), now=0.0) is None
    decision = scaler.decide(1, busy(ready=50, rate=0.0, age=3.0), now=0.0)
    assert decision is not None and decision.after == 2


def test_the_advice_can_ask_for_more() -> None:
    scaler = Autoscaler(1, 8, target_wait=2.0)
    decision = scaler.decide(2, busy(ready=3, rate=10.0, advice=5), now=0.0)
    assert decision is not None and decision.after == 5 and "advice" in decision.reason


def test_new_children_settle_before_the_next_scale_out() -> None:
    scaler = Autoscaler(1, 8, target_wait=2.0)
    assert scaler.decide(1, busy(ready=60, rate=10.0), now=10.0) is not None
    assert scaler.decide(2, busy(ready=60, rate=10.0), now=11.0) is None
    assert scaler.decide(2, busy(ready=60, rate=10.0), now=12.5) is not None


def test_scale_in_one_step_per_cooldown_never_below_minimum() -> None:
    scaler = Autoscaler(2, 5, target_wait=2.0, cooldown=10.0)
    steps = []
    current, now = 5, 0.0
    while now < 100:
        decision = scaler.decide(current, IDLE, now)
        if decision is not None:
            assert decision.after == current - 1
            steps.append(now)
            current = decision.after
        now += 1.0
    assert current == 2
    assert steps == [0.0, 10.0, 20.0]


def test_hysteresis_busy_without_waiting_holds_the_count() -> None:
    scaler = Autoscaler(1, 4, target_wait=2.0, cooldown=0.0)
    steady = Signals(ready=0, rate=20.0, p95_wait=0.1, backlog_age=0.0, saturated=False,
                     idle=False)
    assert all(scaler.decide(3, steady, now=float(t)) is None for t in range(60))


def test_no_scale_in_soon_after_a_scale_out() -> None:
    scaler = Autoscaler(1, 4, target_wait=2.0, cooldown=30.0)
    assert scaler.decide(1, busy(ready=600, rate=10.0), now=0.0) is not None
    assert scaler.decide(4, IDLE, now=20.0) is None
    assert scaler.decide(4, IDLE, now=31.0) is not None


def test_below_minimum_is_raised_at_once() -> None:
    decision = Autoscaler(3, 4).decide(1, IDLE, now=0.0)
    assert decision is not None and decision.after == 3


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        Autoscaler(3, 2)
    with pytest.raises(ValueError):
        Autoscaler(0, 2)


