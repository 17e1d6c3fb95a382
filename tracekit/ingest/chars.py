"""Short string fields (task and irq names above all) -> a String column, fast.

sched_switch, sched_waking, sched_stat_runtime and their kin carry one or two 16-byte
comms per event (`char comm[16]` or a `__data_loc char[]`), so on a sched-heavy trace
these columns are most of the decode. Their values repeat (a few hundred tasks for
millions of events), so each row's bytes, cut at the first NUL, are read as 64-bit
words, a row's words mixed into one key, rows grouped by the key's top bits, and only
one row of each group turned into a string, then gathered per row. Every row is then
checked against the row standing for it: keys sharing a slot are told apart by the
whole key, and whole keys shared by different rows (a collision) make the caller
decode every row. Nothing is trusted unchecked.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import polars as pl

ONES = np.uint64(0x0101010101010101)
HIGHS = np.uint64(0x8080808080808080)
ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
MIX = np.uint64(0x9E3779B97F4A7C15)  # an odd multiplier (golden ratio): spreads word k's bits
BYTE_MASKS = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)  # n low bytes
DISTINCT_SHARE = 8  # dedup pays while distinct rows are at most 1/8 of all rows


def cut_at_nul(words: np.ndarray) -> np.ndarray:
    """(rows x k) little-endian u64 words of NUL-terminated bytes, every byte from the
    first NUL on set to 0 (in place), as the kernel may leave bytes after it."""
    keep = np.full(len(words), ALL)
    for k in range(words.shape[1]):
        v = words[:, k]
        # The lowest 0x80 bit of t marks the first zero byte exactly (higher ones may be
        # false positives after it, which do not matter: only the lowest is used).
        t = (v - ONES) & ~v & HIGHS
        low = t & (~t + np.uint64(1))
        mask = (low >> np.uint64(7)) - np.uint64(1)  # bytes before the NUL; all when none
        mask &= keep
        v &= mask
        keep &= np.uint64(0) - (t == 0).astype(np.uint64)  # a NUL here: later words all 0
    return words


def string_column(words: np.ndarray, decode: Callable[[pl.Series], pl.Series]) -> pl.Series:
    """The strings held by (rows x k) u64 words (cut at their first NUL here, in place).

    `decode` turns a Binary Series into a String one (invalid UTF-8 replaced).
    """
    # Rows equal as they are hold equal strings: deduplicated first, only the distinct rows
    # are cut (the kernel pads most names with NULs, so they are as few either way).
    col = _deduplicated(words, decode, cut=True)
    if col is None:  # bytes after the NUL made the rows too varied: cut every row
        cut_at_nul(words)
        col = _deduplicated(words, decode)
    if col is None:
        col = decode(pl.Series(words.view(f"S{8 * words.shape[1]}").ravel()))
    return col


def _deduplicated(
    words: np.ndarray, decode: Callable[[pl.Series], pl.Series], cut: bool = False
) -> pl.Series | None:
    """The strings of the words, each distinct row decoded once (`cut`: the distinct rows
    cut at their NUL first); None when the rows are too varied for that to pay, or when
    two different rows share a key."""
    n, k = words.shape
    key = words[:, 0] * MIX
    for j in range(1, k):
        key ^= words[:, j]
        key *= MIX
    code, first = _by_slot(key)
    if not _same_rows(words, first[code]):  # distinct keys in one slot: sort them out
        code, first = _by_key(key)
    if len(first) * DISTINCT_SHARE > n or not _same_rows(words, first[code]):
        return None
    distinct = np.ascontiguousarray(words[first])
    if cut:
        cut_at_nul(distinct)
    names = decode(pl.Series(distinct.view(f"S{8 * k}").ravel()))
    return names[code]


SLOT_BITS = 18  # 256k slots: a few hundred distinct keys rarely share one


def _by_slot(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's code and each code's first row, by the key's top bits: numpy only (a
    polars unique costs a query per column), exact unless two keys share a slot."""
    slot = (key >> np.uint64(64 - SLOT_BITS)).astype(np.intp)
    lut = np.full(1 << SLOT_BITS, -1, dtype=np.int32)
    lut[slot[::-1]] = np.arange(len(key) - 1, -1, -1, dtype=np.int32)  # first rows win
    used = np.flatnonzero(lut >= 0)
    rank = np.zeros(1 << SLOT_BITS, dtype=np.int32)
    rank[used] = np.arange(len(used), dtype=np.int32)
    return rank[slot], lut[used].astype(np.int64)


def _by_key(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's code and each code's first row, by the whole key."""
    distinct = np.sort(pl.Series(key).unique().to_numpy())
    code = np.searchsorted(distinct, key)
    first = np.empty(len(distinct), dtype=np.int64)
    first[code[::-1]] = np.arange(len(key) - 1, -1, -1)  # the last write wins: first rows
    return code, first


def _same_rows(words: np.ndarray, rep: np.ndarray) -> bool:
    """Every row equals the row its code stands for."""
    return all((words[:, j] == words[rep, j]).all() for j in range(words.shape[1]))
