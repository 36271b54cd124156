"""A numpy model of a store table, for the tests that check tables against it."""

import numpy as np


class DenseModel:
    """What a table must read as: every row's init value, overwritten where written."""

    def __init__(self, store_mod, table):
        config = table.config
        self.dim = config.row_words
        self.init = np.stack(
            [
                store_mod.init_row(config.init, table.init_stream, row, config.row_words, config.num_rows)
                for row in range(config.num_rows)
            ]
        )
        self.values = self.init.copy()
        self.materialized = np.zeros(config.num_rows, bool)

    def flat_bytes(self):
        return self.values.reshape(-1).view(np.uint8)

    def gather(self, ids):
        self.materialized[ids] = True
        return self.values[ids]

    def write(self, ids, rows):
        for row_id, row in zip(ids, rows):  # in order: the last duplicate wins
            self.values[row_id] = row
        self.materialized[ids] = True

    def write_bytes(self, offset, data):
        self.flat_bytes()[offset : offset + len(data)] = np.frombuffer(data, np.uint8)
        row_bytes = self.dim * 4
        if data:
            self.materialized[offset // row_bytes : (offset + len(data) - 1) // row_bytes + 1] = True

    def erase(self, ids):
        self.values[ids] = self.init[ids]
        self.materialized[ids] = False
