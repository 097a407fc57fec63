"""RE2 for tenant-written regular expressions, with bounds on memory and matching work.

HTTPRoutes are written by tenants, so one route's regex must not be able to take a
replica down. RE2 already guarantees linear-time matching (no backtracking), but it
still spends memory and time in proportion to the compiled program and the subject:

- each compiled regex gets a memory budget of :data:`REGEX_MAX_MEM` for its program and
  its lazily built DFA cache (RE2's default is 8 MiB *per regex*; 4,000 regexes matched
  once against a long path reached 850 MB). When the DFA runs out of its budget RE2
  falls back to a slower engine: the answer stays right, the memory stays bounded;
- a regex whose program exceeds :data:`MAX_PROGRAM_SIZE` instructions is rejected
  (``[a-z]{1000}`` is ~1,000), and so is a config whose regexes add up to more than
  :data:`MAX_CONFIG_PROGRAM_SIZE` (the table holds them all in memory, and a request
  that falls through a bucket runs all of its regexes);
- a subject (decoded path, header value, query value) longer than
  :data:`MAX_SUBJECT_BYTES` never matches a regex: matching work grows with subject
  length times program size, and a regex route is not meant for multi-kilobyte paths.
"""

from __future__ import annotations

from typing import Any, Final

import re2

REGEX_MAX_MEM: Final = 1 << 20
MAX_PROGRAM_SIZE: Final = 1_000
MAX_CONFIG_PROGRAM_SIZE: Final = 50_000
MAX_SUBJECT_BYTES: Final = 1_024


def compile_regex(pattern: str) -> Any:
    """Compile with RE2 and the memory budget :data:`REGEX_MAX_MEM`.

    Raises ``re2.error`` for patterns RE2 rejects (look-around, back-references, a
    program too large for the budget, ...).
    """
    options = re2.Options()
    options.log_errors = False  # the error is reported through ConfigError instead
    options.max_mem = REGEX_MAX_MEM
    return re2.compile(pattern, options)


def program_size(compiled: Any) -> int:
    """Instructions in the compiled (forward) program: RE2's measure of its cost."""
    return int(compiled.programsize)
