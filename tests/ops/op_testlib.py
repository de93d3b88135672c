"""What the op tests of several families share: the clear-error assertion for bad arguments."""

from __future__ import annotations

import pytest


def assert_argument_error(op, args, arg: str, text: str) -> None:
    """Calling `op` with `args` raises a ValueError or TypeError that names the op and the
    argument `arg` first and contains `text`."""
    with pytest.raises((ValueError, TypeError)) as info:
        op(*args)
    message = str(info.value)
    assert message.startswith(f"{op.name}: argument '{arg}'"), message
    assert text in message, message
