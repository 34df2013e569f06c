"""``CompileReport``: collect one run's compile events and write the page; KILN_REPORT and ``kiln report``."""

from __future__ import annotations

import atexit
import functools
import os
import runpy
import sys
import time
import traceback
from pathlib import Path
from types import TracebackType

from kiln.graph import EVENTS
from kiln.knobs import KNOBS

from .collect import Collector
from .page import render


class CompileReport:
    """While active (``start()`` .. ``stop()``, or a ``with`` block), every compile event of this process
    is kept, with each stage's program text; ``write(folder)`` renders the page."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.collector = Collector()

    def start(self) -> CompileReport:
        EVENTS.subscribe(self.collector.on_event, texts=True)
        return self

    def stop(self) -> None:
        EVENTS.unsubscribe(self.collector.on_event)

    def __enter__(self) -> CompileReport:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def html(self) -> str:
        return render(self.collector.run, self.title)

    def write(self, folder: Path) -> Path:
        """Write the page as ``folder/kiln-report-<time>-<pid>.html`` (atomically) and return its path."""
        folder.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(self.collector.run.started))
        path = folder / f"kiln-report-{stamp}-{os.getpid()}.html"
        tmp = path.with_suffix(".html.tmp")
        tmp.write_text(self.html(), encoding="utf-8")
        os.replace(tmp, path)
        return path


def _write_at_exit(report: CompileReport, folder: Path) -> None:
    report.stop()
    try:
        path = report.write(folder)
    except OSError as e:
        print(f"kiln: could not write the compile report into {folder} (KILN_REPORT): {e}", file=sys.stderr)
        return
    print(f"kiln: compile report written to {path}", file=sys.stderr)


@functools.cache
def report_from_env() -> CompileReport | None:
    """With KILN_REPORT=dir, start this process's report (once) and write it into dir at exit."""
    if KNOBS.report_dir is None:
        return None
    report = CompileReport(" ".join(sys.argv) or "python").start()
    atexit.register(_write_at_exit, report, KNOBS.report_dir)
    return report


def run_script(script: Path, args: list[str], folder: Path) -> tuple[Path, BaseException | None]:
    """Run ``script`` as ``__main__`` with ``args`` under a report; the page's path and the script's error."""
    if not script.is_file():
        raise FileNotFoundError(f"kiln report: no such script {script}")
    argv = sys.argv
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(script.resolve().parent))
    error: BaseException | None = None
    with CompileReport(" ".join([script.name, *args])) as report:
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as e:
            if e.code not in (None, 0):
                error = e
        except Exception as e:  # noqa: BLE001 - the report of a failing run is still written
            error = e
            report.collector.run.error = "".join(traceback.format_exception(e))
        finally:
            sys.argv = argv
            sys.path.remove(str(script.resolve().parent))
    return report.write(folder), error
