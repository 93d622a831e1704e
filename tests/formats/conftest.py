"""The ggml reference library, for the parity tests of tests/formats."""

from __future__ import annotations

import pytest

from tests import ggml_ref


@pytest.fixture(scope="session")
def ggml() -> ggml_ref.GGMLReference:
    ref = ggml_ref.load()
    if ref is None:
        pytest.skip(
            "no libggml-base to compare with: install llama-cpp-python==0.3.36 "
            "or point EDGEINFER_GGML_LIB at a libggml-base built from the same source"
        )
    return ref
