"""The GGUF fuzz target reaches every error class the bad-file tests name, from its seeds and
the inputs kept in tests/fuzz/regressions/fuzz_gguf/."""

from __future__ import annotations

import pytest

from edgeinfer import errors
from tests.gguf import fuzz_inputs

# every class the tests under tests/gguf and tests/api expect from a bad file
BAD_FILE_ERRORS = {
    errors.BadMagicError, errors.UnsupportedVersionError, errors.TruncatedFileError,
    errors.AbsurdValueError, errors.DuplicateNameError, errors.UnknownValueTypeError,
    errors.UnknownTensorTypeError, errors.MisalignedTensorError, errors.TensorOutOfBoundsError,
    errors.MissingKeyError, errors.MissingTensorError, errors.UnknownArchitectureError,
    errors.UnusedTensorError, errors.TokenizerError, errors.UnsupportedModelError,
}  # fmt: skip


def test_kept_inputs_are_the_crafted_ones():
    for name, data in fuzz_inputs.crafted().items():
        path = fuzz_inputs.FOLDER / f"crafted-{name}"
        assert path.read_bytes() == data, f"{path} is stale: python -m tests.gguf.fuzz_inputs"


def test_fuzz_target_reaches_every_bad_file_error():
    pytest.importorskip("atheris")
    from tests.fuzz import fuzz_gguf

    raised: dict[type, int] = {}
    kept = sorted(p for p in fuzz_inputs.FOLDER.iterdir() if p.is_file())
    passed = 0
    for data in [*fuzz_gguf.seeds(), *(p.read_bytes() for p in kept)]:
        try:
            fuzz_gguf.one_input(data)
            passed += 1
        except errors.EdgeInferError as e:
            raised[type(e)] = raised.get(type(e), 0) + 1
    assert passed >= 5  # the seeds load: the checks after the header are reached
    missing = sorted(c.__name__ for c in BAD_FILE_ERRORS - set(raised))
    assert not missing, f"never raised: {missing}"
