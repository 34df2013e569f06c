"""What a recompile says: the failing guard of the newest entry as a reason line, and as a key that
counts repeated failures of one guard together (the recompile-limit warning names the one that kept
failing)."""

from __future__ import annotations

import re

from kiln.graph import Guard, GuardSet

RELAID_OUT = "a parameter or buffer changed layout in place (p.data = ..., module.to(...), requires_grad_)"

ALIASING = "input aliasing"  # a failure of the entry's aliasing check (aliasing.py), reported as a guard


def failure_key(failure: tuple[Guard, str] | None, guards: GuardSet | None = None) -> str:
    """The failing guard without the values seen, so repeated failures of one guard count together:
    a size guard counts by the sizes it reads (``s0 <= 5`` then ``s0 <= 6`` are one size that keeps
    failing)."""
    if failure is None:
        return "no entry matched"
    g = failure[0]
    if g.kind == "SHAPE_EXPR":
        names = set(re.findall(r"[a-z]+\d+", str(g.expected)))
        sources = sorted({s.source for s in guards or () if s.kind == "SYMBOL" and str(s.expected) in names})
        return f"size guards on {', '.join(sources) or str(g.expected)}"
    return f"{g.kind} on {g.source or '<global>'}"


def failure_text(failure: tuple[Guard, str] | None) -> str:
    if failure is None:  # guards held: the entry's module-call check failed (module_calls.py)
        return "no entry matched: a module's hooks or forward, or the global module hooks, changed"
    g, actual = failure
    if g.kind == "SHAPE_EXPR":
        pinned = " (a graph specialised to one size: the backend or the code read it as an int)" \
            if re.fullmatch(r"\(?\w+ (==|<=) \d+\)?", str(g.expected)) else ""
        return f"size guard {g.expected} failed ({g.note}) with {actual}{pinned}"
    if g.kind == "GLOBAL_STATE" and g.expected == ALIASING:  # not a guard: the entry's aliasing check
        return actual
    if g.kind == "GLOBAL_STATE":  # the global torch state: only what changed
        return f"guard failed: GLOBAL_STATE: {actual}"
    expected = " ".join(repr(g.expected).split())
    if len(expected) > 160:  # a module's keys, a long tuple: the kind and source say which guard
        expected = f"{expected[:160]}... ({len(expected)} characters)"
    return f"guard failed: {g.kind} {g.source or '<global>'}: expected {expected}, got {actual}"
