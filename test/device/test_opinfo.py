"""PyTorch's own OpInfo database on recdev, through instantiate_device_type_tests.

Samples are made for recdev as PyTorch's own test_ops makes them for a device;
each runs on recdev and, moved to the CPU, on the CPU, and the results must be
equal. Two kinds of op cannot be compared value for value, and for those the
test compares shape, dtype and device instead:
- random ops (they use the generator; recdev's stream is not CPU's), which must
  also be reproducible under the same seed;
- ops whose output is uninitialized memory (empty and friends).
"""

import contextlib
import itertools
import random

import numpy as np
import torch
import torch_recdev
from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from opinfo_expected_failures import UNINITIALIZED_OUTPUT, reason_for

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool)
# The first samples of each op already cover its broadcasting, scalar and
# empty cases; more mostly repeat them and multiply the suite's run time.
MAX_SAMPLES = 8
# On tables the ops run on the same kernels as above; what is new there is the storage, rows of a
# table of the tensor's element type read back as the tensor. One dtype per element type of tables
# (float32, float64, float16, bfloat16, bytes: bool is stored as int64 is) and the first 4 samples
# cover that, in half the time.
TABLE_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64)
TABLE_MAX_SAMPLES = 4


def _cpu_twin(t):
    """The same view of a CPU copy of t's whole storage, so that ops that look
    past a view's bounds (as_strided on a slice) see the same bytes."""
    if t.layout != torch.strided or t.device.type != "recdev" or t.is_conj() or t.is_neg():
        return t.cpu()
    storage = t.untyped_storage().cpu()
    twin = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())
    return twin.requires_grad_(t.requires_grad)


def _to_cpu(value, tensor_to_cpu=torch.Tensor.cpu):
    def move(x):
        if isinstance(x, torch.Tensor):
            return tensor_to_cpu(x)
        if isinstance(x, torch.device) and x.type == "recdev":
            return torch.device("cpu")
        if isinstance(x, str) and x.startswith("recdev"):
            return "cpu"
        return x

    return tree_map(move, value)


def _seed(seed=0):
    """Seeds what samples and ops draw from: the CPU and recdev generators (as torch.manual_seed
    does; test_rng.py checks that torch.manual_seed reaches recdev), Python's and numpy's.
    torch.manual_seed itself also queues a lazy seed for CUDA, XPU and MTIA with a formatted stack
    trace each, which took half of this suite's time when it ran before every op and sample."""
    torch.random.default_generator.manual_seed(seed)
    torch.recdev.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _samples(op, device, dtype, max_samples):
    """The op's first samples, drawn from one seed. op.sample_inputs would reseed before each sample
    through torch.manual_seed and crawl the stack (inspect.stack, reading source files) twice per
    call to find the test for its debugging aid: together a third of the suite's time. A failure
    here names its sample by index instead (_check_op)."""
    _seed()
    return list(itertools.islice(op.sample_inputs_func(op, device, dtype, False), max_samples))


def _run(op, sample, seed=0):
    _seed(seed)
    return op(sample.input, *sample.args, **sample.kwargs)


class _SeededOpDetector(TorchDispatchMode):
    """Notes whether any aten op that runs is tagged nondeterministic_seeded
    (draws from a generator)."""

    seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if torch.Tag.nondeterministic_seeded in func.tags:
            self.seen = True
        return func(*args, **(kwargs or {}))


def _run_on_cpu(op, cpu_sample):
    """The CPU result, and whether the op drew from a generator to make it: one run answers both."""
    with _SeededOpDetector() as detector:
        expected = _run(op, cpu_sample)
    return expected, detector.seen


def _metadata(value):
    leaves, _ = tree_flatten(value)
    return [(x.shape, x.dtype) if isinstance(x, torch.Tensor) else type(x) for x in leaves]


def _suite(name, placement, dtypes, max_samples):
    """A test class comparing recdev with CPU under a placement (None: the
    default rules, which put these small tensors in host storage). Built by a
    function because instantiate_device_type_tests only instantiates a class's
    own test methods, not inherited ones."""

    class Suite(TestCase):
        exact_dtype = True

        def _check_op(self, device, dtype, op):
            samples = _samples(op, device, dtype, max_samples)
            if not samples:
                self.skipTest(f"{op.name} has no samples for {dtype}")
            for index, sample in enumerate(samples):
                try:
                    self._check_sample(op, sample)
                except Exception as e:
                    e.add_note(f"sample {index} of {op.full_name}: {sample.summary()}")
                    raise

        def _check_sample(self, op, sample):
            cpu_sample = sample.transform(lambda x: _to_cpu(x, _cpu_twin))
            cpu_sample.kwargs = _to_cpu(cpu_sample.kwargs, _cpu_twin)
            actual = _run(op, sample)
            expected, is_random = _run_on_cpu(op, cpu_sample)
            asks_for_another_device = "device" in sample.kwargs and "recdev" not in str(sample.kwargs["device"])
            for leaf in tree_flatten(actual)[0]:
                if isinstance(leaf, torch.Tensor) and not asks_for_another_device:
                    self.assertEqual(leaf.device.type, "recdev", msg=f"{op.name} returned a {leaf.device} tensor")
            if op.name in UNINITIALIZED_OUTPUT:
                self.assertEqual(_metadata(actual), _metadata(expected))
            elif is_random:
                self.assertEqual(_metadata(actual), _metadata(expected))
                self.assertEqual(_to_cpu(actual), _to_cpu(_run(op, sample)), msg="not reproducible under the same seed")
            else:
                self.assertEqual(_to_cpu(actual), expected)

        def _check_placed(self, device, dtype, op):
            placed = torch_recdev.placement(self.placement) if self.placement else contextlib.nullcontext()
            with placed:
                self._check_op(device, dtype, op)

        @ops(op_db, allowed_dtypes=dtypes)
        def test_matches_cpu(self, device, dtype, op):
            reason = reason_for(op.full_name, dtype, self.placement)
            if reason is None:
                self._check_placed(device, dtype, op)
                return
            try:
                self._check_placed(device, dtype, op)
            except Exception:
                self.skipTest(f"expected failure: {reason}")
            self.fail(f"{op.full_name} {dtype} now passes: remove it from opinfo_expected_failures.py")

    Suite.placement = placement
    Suite.__name__ = Suite.__qualname__ = name
    return Suite


TestRecdevMatchesCPU = _suite("TestRecdevMatchesCPU", None, DTYPES, MAX_SAMPLES)
TestRecdevOnTablesMatchesCPU = _suite("TestRecdevOnTablesMatchesCPU", "table", TABLE_DTYPES, TABLE_MAX_SAMPLES)
instantiate_device_type_tests(TestRecdevMatchesCPU, globals(), only_for="privateuse1")
instantiate_device_type_tests(TestRecdevOnTablesMatchesCPU, globals(), only_for="privateuse1")

if __name__ == "__main__":
    run_tests()
