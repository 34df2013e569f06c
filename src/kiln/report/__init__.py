"""The compile report: one self-contained HTML page per run (``KILN_REPORT=dir`` or ``kiln report``).

``CompileReport`` listens to kiln's compile events while it is active (collect.py files them per
graph), and renders the page (page.py) with a compile-time chart (chart.py).
"""

from .collect import Collector, GraphRecord, Program, RunRecord
from .report import CompileReport, report_from_env, run_script

__all__ = ["Collector", "CompileReport", "GraphRecord", "Program", "RunRecord", "report_from_env", "run_script"]
