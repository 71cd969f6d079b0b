"""Arrow arrays of Python values made from buffers, for the read's batches (:mod:`.arrow_read`)
and the publish's summaries (:mod:`.publish`).

``pa.array`` and ``pa.scalar`` of Python values first ask pyarrow whether the value is a pandas
object, and the first such question in a process imports pandas where it is installed: about
170 ms of CPU in each fresh Python worker, which nothing else in a read or a publish needs
(issue 57). ``pa.Array.from_buffers`` asks nothing; the arrays are the same. A scalar is an
array's element (``int_array([v])[0]``), a null scalar ``pa.nulls(1, type)[0]``.
"""

from __future__ import annotations

import array
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["bytes_array", "int_array"]

# Arrow's buffers are little-endian; array.array's are in the machine's order.
_NATIVE = sys.byteorder == "little"
_LARGEST_32_BIT_OFFSET = 2**31 - 1


def int_array(values: Sequence[int], kind: pa.DataType | None = None) -> pa.Array:
    """``values`` as an int64 (or ``kind``: int32) array.

    :raises OverflowError: a value outside the type's range (as ``pa.array`` would).
    """
    import pyarrow as pa

    kind = pa.int64() if kind is None else kind
    if not _NATIVE:
        return pa.array(values, kind)
    data = array.array("q" if kind == pa.int64() else "i", values)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(data)])


def bytes_array(values: Sequence[bytes], kind: pa.DataType | None = None) -> pa.Array:
    """``values`` as a binary (or ``kind``: string, of UTF-8 bytes) array, none of them null."""
    import pyarrow as pa

    kind = pa.binary() if kind is None else kind
    data = b"".join(values)
    if not _NATIVE or len(data) > _LARGEST_32_BIT_OFFSET:
        # pyarrow's own conversion: it splits what 32-bit offsets cannot hold.
        return pa.array([v.decode() for v in values] if kind == pa.string() else values, kind)
    import pyarrow.compute as pc

    # The offsets: 0 and the running sum of the lengths, summed by Arrow (a Python loop costs more).
    lengths = int_array(list(map(len, values)), pa.int32())
    offsets = pa.concat_arrays([int_array([0], pa.int32()), pc.cumulative_sum(lengths)])
    return pa.Array.from_buffers(kind, len(values), [None, offsets.buffers()[1], pa.py_buffer(data)])
