from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test compiles from scratch, and leaves no compiled code behind."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
