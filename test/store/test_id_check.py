"""The row-id check every batch makes before it touches a row (csrc/store/id_check.cpp): one id out of
range anywhere in a batch, at every position of every length around the AVX2 kernel's steps of 8 ids,
refuses the batch whole with that id and its position named, and leaves the table as it was; ids at
the last row pass. The AVX2 kernel and the portable one each run in a process of their own,
ATEN_CPU_CAPABILITY capping the choice."""

import pytest

_WORKER = """
import importlib, os
import numpy as np
store_mod = importlib.import_module(os.environ.get("RECDEV_STORE_MODULE", "torch_recdev._testing"))._store
ROWS = 1000
store = store_mod.Store()
table = store.table(store.create_table(store_mod.TableConfig(
    num_rows=ROWS, row_words=2, state_words=0, init=store_mod.InitRule.normal(0, 1, seed=4))))
checked = 0
for length in range(1, 42):
    ids = np.arange(ROWS - length, ROWS, dtype=np.uint64)  # the last rows: all in range
    for position in range(length):
        for bad in (ROWS, ROWS + 1, 2**63, 2**64 - 1):  # 2**63 and up: a negative int64 id
            wrong = ids.copy()
            wrong[position] = bad
            for call in (table.gather, table.exists):
                try:
                    call(wrong)
                except Exception as e:
                    expected = f"row id {bad} (ids[{position}]) is out of range [0, {ROWS})"
                    assert expected in str(e), (length, position, bad, str(e))
                else:
                    raise AssertionError(f"{call.__name__} took id {bad} at {position} of {length}")
                checked += 1
    assert table.stats().rows == 0, "a refused batch materialized rows"
assert table.exists(np.arange(ROWS - 41, ROWS, dtype=np.uint64)).tolist() == [False] * 41
assert table.gather(np.arange(ROWS - 41, ROWS, dtype=np.uint64)).shape == (41, 2)
assert table.stats().rows == 41
print(checked)
"""


@pytest.mark.parametrize("capability", [None, "default"], ids=["widest", "portable"])
def test_one_id_out_of_range_anywhere_refuses_the_batch_whole(run_capped, capability):
    assert int(run_capped(["-c", _WORKER], capability)) == 2 * 4 * sum(range(1, 42))
