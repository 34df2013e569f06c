"""kiln.capture's pipeline, top to bottom.

    capture.run_capture        interpret the frame's bytecode on fake tensors (frame.py + op_*.py),
                               lifting inputs/parameters to placeholders and collecting guards
      -> capture._package      graph outputs from the live values, dead-code removal, guard ordering
      -> compile_capture       verify (KILN_VERIFY), log graph_code, dump, call the backend, then take
                               the shape guards again from the ShapeEnv (the backend's assumptions too)
      -> optimize._make_entry  compile guards, build the input extractor, cache the entry
"""

from __future__ import annotations

import types

from torch import fx
from torch._subclasses.fake_tensor import FakeTensor

from kiln.graph import (
    KNOBS,
    Backend,
    CompiledFn,
    dump,
    enabled,
    keeping_texts,
    log,
    new_graph_id,
    verify,
)

from .capture import Capture, refresh_shape_guards


def compile_capture(cap: Capture, backend: Backend,
                    code: types.CodeType | None) -> CompiledFn | None:
    """Hand the captured graph to the backend (or nothing when the graph computes nothing)."""
    gm = cap.captured.gm
    if KNOBS.verify:
        verify(gm, "torch")
    name = code.co_name if code is not None else "graph"
    if enabled("graph_code"):
        log("graph_code").info("captured graph for %s:\n%s", name, cap.captured.as_text())
    if keeping_texts():
        dump(new_graph_id(name), "capture", cap.captured.as_text())
    compiled = backend(gm, list(cap.example_inputs)) if needs_backend(cap) else None
    forget_real_tensors(gm)
    # the backend traced with the capture's ShapeEnv: what it assumed about sizes is guarded too
    cap.captured = refresh_shape_guards(cap.captured)
    if enabled("guards"):
        log("guards").info("guards for %s:\n%s", name, cap.captured.guards.as_text())
    return compiled


def forget_real_tensors(gm: fx.GraphModule) -> None:
    """Note: the fake mode a capture traced with remembers each real tensor it made a fake of, by weak
    reference (its MetaTensorDescriber's memo), for as long as the graph's fake values live. Nothing
    converts real tensors with it once the graph is compiled, and a weak reference to a tensor makes
    ``torch.utils.swap_tensors`` refuse it ("has weakref associated with it"): a compiled model's
    parameters could not be swapped. So the memos are cleared here."""
    modes = {id(v.fake_mode): v.fake_mode for n in gm.graph.nodes
             if isinstance(v := n.meta.get("val"), FakeTensor)}
    for mode in modes.values():
        meta = mode.fake_tensor_converter.meta_converter
        meta.describer.lookup_tensor.clear()
        meta.describer.lookup_storage.clear()
        meta.tensor_memo.clear()
        meta.storage_memo.clear()


def frame_name(code: types.CodeType) -> str:
    """How events and reports name a frame: ``fn (file.py:12)``."""
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})"


def needs_backend(cap: Capture) -> bool:
    """A graph that computes nothing and returns nothing is not handed to the backend."""
    gm = cap.captured.gm
    has_outputs = bool(next(n for n in gm.graph.nodes if n.op == "output").args[0])
    return has_outputs or cap.op_count > 0
