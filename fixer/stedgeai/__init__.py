"""Find and run ST Edge AI Core (``stedgeai``), and read what it writes.

ST Edge AI Core is proprietary and may not be installed; everything here that does not start a
process is a pure function on text or JSON, so reports produced elsewhere can be read too.

* Discovery: :func:`find_stedgeai` and :func:`stedgeai_version`.
* Running: :func:`run_generate` starts ``stedgeai generate --target stm32n6 --st-neural-art``
  without a shell, streams every log line, enforces a timeout, and parses the results.
* Parsers: :func:`parse_report` (both report formats), :func:`parse_c_info`
  (``network_c_info.json``), :func:`parse_epoch_csv` (atonn's per-epoch CSV).
* Known errors: :func:`explain` recognises the compiler failures listed in ``KNOWN_ERROR_PATTERNS``
  and says what to do about each.

ST says the report format "is subject to changes", so the parsers read values by their labels
(``Total number of epochs``, ``>> pure software (SW) epochs``, table headers), never by column
position.
"""

from __future__ import annotations

from .locate import (  # noqa: F401
    _UTILITIES_FOLDERS,
    _VERSION_RE,
    _utilities_folder,
    find_stedgeai,
    parse_version,
    stedgeai_version,
)
from .reports import (  # noqa: F401
    EpochKind,
    CInfoKind,
    EpochRow,
    PoolUsage,
    IoInfo,
    StedgeaiReport,
    _UNIT_BYTES,
    _FORMAT_A_TOTAL,
    _EC_BLOBS,
    _FORMAT_A_ROW,
    _TABLE_ID_SINGLE,
    _TABLE_ID_RANGE,
    _MEMORY_LINE,
    _MEMORY_PART,
    _IO_LINE,
    _QLINEAR,
    _to_bytes,
    _split_ops,
    _kind_from_token,
    _parse_format_a_rows,
    _table_cells,
    _parse_format_b_rows,
    _parse_memory,
    _parse_shape,
    _parse_io,
    parse_report,
    load_report,
    MalformedReport,
    MAX_EPOCH_ROWS,
    _MAPPING_KINDS,
    _NODE_KIND_DESCRIPTION,
    _EC_BLOB_DESCRIPTION,
    _EPOCH_NAME,
    _BOOKKEEPING_OPS,
    CInfoEpoch,
    CInfoPool,
    CInfoBuffer,
    CInfo,
    _leaves,
    _op_type,
    _int_or_none,
    parse_c_info,
    load_c_info,
    EpochCsv,
    parse_epoch_csv,
)
from .explain import (  # noqa: F401
    KnownError,
    KnownErrorPattern,
    KNOWN_ERROR_PATTERNS,
    _UNALLOCATED,
    _line_at,
    explain,
)
from .run import (  # noqa: F401
    CompileResult,
    _generate_command,
    _kill_process_tree,
    _pump,
    _find_first,
    run_generate,
)

__all__ = [
    "CInfo",
    "CInfoBuffer",
    "CInfoEpoch",
    "CInfoPool",
    "CompileResult",
    "EpochCsv",
    "EpochRow",
    "IoInfo",
    "KNOWN_ERROR_PATTERNS",
    "KnownError",
    "KnownErrorPattern",
    "PoolUsage",
    "StedgeaiReport",
    "explain",
    "find_stedgeai",
    "load_c_info",
    "load_report",
    "parse_c_info",
    "parse_epoch_csv",
    "parse_report",
    "parse_version",
    "run_generate",
    "stedgeai_version",
]
