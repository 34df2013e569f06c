"""Shared pieces of the kiln benchmark harness: model suite, backends, measurement, reports.

Nothing here imports kiln at module import time: kiln is looked up per row, so a missing or
broken kiln turns into an "n/a (<reason>)" row, never a crash of the harness.
"""
