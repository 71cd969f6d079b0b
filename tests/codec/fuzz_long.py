"""The long fuzz run: ``python -m tests.codec.fuzz_long [N]`` (default 1,000,000 inputs).

Half random buffers, half mutations of valid frames; any exception other than the
codec's own errors stops the run and prints the input.
"""

from __future__ import annotations

import random
import sys
import time

from tests.codec.test_fuzz import SEEDS, decode_any, mutate


def main() -> int:
    total = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    rng = random.Random(int(time.time()))
    start = time.perf_counter()
    for i in range(total):
        data = rng.randbytes(rng.randint(0, 48)) if i % 2 else mutate(rng, SEEDS[i % len(SEEDS)])
        try:
            decode_any(data)
        except Exception:
            print(f"input {i} escaped the codec's errors: {data.hex()}", file=sys.stderr)
            raise
    print(f"fuzzed {total:,} inputs in {time.perf_counter() - start:.1f} s: only codec errors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
