"""What test_opinfo.py needs to know about particular ops.

EXPECTED_FAILURES: (op, dtype) pairs of PyTorch's OpInfo database that do not
match CPU on recdev, one reason each. test_opinfo.py fails when a listed pair
starts to pass, so the list cannot go stale. Keys are OpInfo full names
("name.variant"); a dtype of None means every dtype.

UNINITIALIZED_OUTPUT: ops whose result is uninitialized memory on every
device, so only shape, dtype and device can be compared.
"""

import torch

EXPECTED_FAILURES: dict[tuple[str, torch.dtype | None], str] = {
    ("sparse.sampled_addmm", None): "sparse CSR layouts are not supported on recdev (strided and sparse COO only)",
}

UNINITIALIZED_OUTPUT = frozenset(
    {"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty", "new_empty_strided"}
)


# Failures only when every allocation is forced to table storage.
_AUTO_ACC_DTYPE = (
    "acc_policy='auto' accumulates half inputs in float32 on CPU only (LinearCrossEntropyOptions."
    "_resolve_auto_acc_dtype), in the input dtype elsewhere: one rounding apart (host samples round alike)"
)
EXPECTED_TABLE_FAILURES: dict[tuple[str, torch.dtype | None], str] = {
    ("nn.functional.linear_cross_entropy.chunked_none", torch.float16): _AUTO_ACC_DTYPE,
    ("nn.functional.linear_cross_entropy.chunked_none", torch.bfloat16): _AUTO_ACC_DTYPE,
}


def reason_for(op_name: str, dtype: torch.dtype, placement: str | None = None):
    tables = EXPECTED_TABLE_FAILURES if placement == "table" else {}
    for failures in (EXPECTED_FAILURES, tables):
        reason = failures.get((op_name, dtype)) or failures.get((op_name, None))
        if reason:
            return reason
    return None
