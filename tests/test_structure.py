"""The structure a reader finds from the folders: each stage's steps in order in its pipeline.py."""

from __future__ import annotations

import importlib
import re

import pytest

STAGES = ("capture", "autograd", "decomp", "inductor", "runtime")


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_lists_its_steps_in_pipeline_py(stage: str) -> None:
    module = importlib.import_module(f"kiln.{stage}.pipeline")
    doc = module.__doc__ or ""
    assert "order" in doc or "top to bottom" in doc, f"kiln.{stage}.pipeline's docstring does not say its order"


def test_the_runtime_pipeline_names_functions_that_exist() -> None:
    """The runtime's save and load steps are a table in pipeline.py's docstring: every function it
    names (``module.function`` or ``module.Class.method``) exists, so the table cannot go stale."""
    import kiln.runtime as runtime
    import kiln.runtime.pipeline as pipeline

    rows = [line for line in (pipeline.__doc__ or "").splitlines() if re.match(r"^  \d+\. ", line)]
    assert len(rows) == len(pipeline.SAVE_STEPS) + len(pipeline.LOAD_STEPS)
    missing = []
    for row in rows:
        dotted = row[30:].split()[0]  # the function column
        first, *attrs = dotted.split(".")
        obj: object = (getattr(runtime, first) if first[0].isupper()
                       else importlib.import_module(f"kiln.runtime.{first}"))
        for a in attrs:
            obj = getattr(obj, a, None)
        if obj is None:
            missing.append(dotted)
    assert not missing, f"kiln.runtime.pipeline names what does not exist: {missing}"
