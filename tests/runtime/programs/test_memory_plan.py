"""memory_plan.py: requests whose lifetimes overlap never share a slot, and the plan is tight."""

from __future__ import annotations

import itertools
import random

import pytest

from runtime.programs.memory_plan import Request, plan_memory


def _check(requests, plan):
    assert len(plan.slot_of) == len(requests)
    for i, j in itertools.combinations(range(len(requests)), 2):
        a, b = requests[i], requests[j]
        if plan.slot_of[i] == plan.slot_of[j]:
            assert a.last < b.first or b.last < a.first, (a, b)
    for i, r in enumerate(requests):
        assert plan.slot_bytes[plan.slot_of[i]] >= r.nbytes
    assert plan.peak_bytes <= plan.planned_bytes <= plan.unshared_bytes


def test_a_chain_reuses_two_buffers():
    # x0 -> x1 -> x2 -> x3: each value lives from its producer to its consumer.
    requests = [Request(100, i, i + 1) for i in range(4)]
    plan = plan_memory(requests)
    _check(requests, plan)
    assert plan.slot_bytes == (100, 100) and plan.peak_bytes == 200 and plan.unshared_bytes == 400


def test_scratch_shares_with_later_values():
    requests = [Request(64, 0, 3), Request(1000, 1, 1), Request(900, 2, 3)]  # scratch at node 1
    plan = plan_memory(requests)
    _check(requests, plan)
    assert plan.slot_of[1] == plan.slot_of[2] and plan.planned_bytes == 1064


def test_empty():
    plan = plan_memory([])
    assert plan.slot_bytes == () and plan.planned_bytes == plan.peak_bytes == plan.unshared_bytes == 0


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes(seed):
    rng = random.Random(seed)
    requests = []
    for _ in range(rng.randint(1, 60)):
        first = rng.randint(0, 40)
        requests.append(Request(16 * rng.randint(1, 100), first, first + rng.randint(0, 8)))
    _check(requests, plan_memory(requests))
