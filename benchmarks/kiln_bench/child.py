"""Child-process entry of ``isolate.run_isolated``: ``python -m benchmarks.kiln_bench.child TASK``.

Any exception from the measurement is written as ``{"error": ...}``, so only hard crashes
(signals, OOM kills) and timeouts are left for the parent to describe.
"""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def main(task_path: str) -> None:
    task = json.loads(Path(task_path).read_text())
    module_name, func_name = task["target"].split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        result = func(**task["kwargs"])
    except Exception as exc:  # noqa: BLE001 - the row records it
        from benchmarks.kiln_bench.backends import error_details, short_error

        print(error_details(exc), file=sys.stderr)
        result = {"error": short_error(exc)}
    Path(task["result"]).write_text(json.dumps(_jsonable(result)))


if __name__ == "__main__":
    main(sys.argv[1])
