"""The host-side checks on a program's input values (runtime/programs/input_checks.py), on inputs
of a decode step's size (checked as Python ints) and of a prompt's (checked with torch), alike."""

from __future__ import annotations

import pytest
import torch

from runtime.programs.input_checks import InputValueError, check_input_values
from runtime.programs.nodes import InputCheck

CHECKS = [InputCheck("pos", "position", 1000), InputCheck("ids", "index", 50),
          InputCheck("pos", "consecutive", 0)]


def _env(start: int, count: int, ids=None) -> dict:
    ids = torch.full((1, count), 7) if ids is None else ids
    return {"ids": ids, "pos": torch.arange(start, start + count)}


@pytest.mark.parametrize("count", [1, 5, 300], ids=["a step", "a few tokens", "a prompt"])
def test_good_values_pass_and_advance_the_next_position(count):
    following = {}
    check_input_values(CHECKS, _env(3, count), following, "prog")
    assert following == {"pos": 3 + count}
    check_input_values(CHECKS, _env(3 + count, count), following, "prog")
    assert following == {"pos": 3 + 2 * count}


@pytest.mark.parametrize("count", [1, 300])
def test_a_position_going_backwards_is_refused(count):
    following = {"pos": 10}
    with pytest.raises(InputValueError, match="input 'pos' goes backwards: it starts at 9"):
        check_input_values(CHECKS, _env(9, count), following, "prog")
    assert following == {"pos": 10}


@pytest.mark.parametrize("count", [1, 300])
@pytest.mark.parametrize("bad", [-1, 50])
def test_a_token_id_outside_the_table_is_refused(count, bad):
    ids = torch.full((1, count), 7)
    ids[0, -1] = bad
    with pytest.raises(InputValueError, match=rf"input 'ids' holds the token id {bad}, outside \[0, 50\)"):
        check_input_values(CHECKS, _env(0, count, ids), {}, "prog")


@pytest.mark.parametrize("count", [2, 300])
def test_positions_that_do_not_count_up_by_one_are_refused(count):
    env = _env(0, count)
    env["pos"][-1] += 1
    with pytest.raises(InputValueError, match="input 'pos' must hold consecutive positions"):
        check_input_values(CHECKS, env, {}, "prog")


@pytest.mark.parametrize("count", [1, 300])
def test_a_position_past_the_state_is_refused(count):
    with pytest.raises(InputValueError, match=r"input 'pos' holds the position 1000, outside \[0, 1000\)"):
        check_input_values(CHECKS, _env(1000 - count + 1, count), {}, "prog")


def test_empty_inputs_are_not_checked():
    following = {}
    check_input_values(CHECKS, {"ids": torch.zeros(1, 0, dtype=torch.int64),
                                "pos": torch.zeros(0, dtype=torch.int64)}, following, "prog")
    assert following == {}
