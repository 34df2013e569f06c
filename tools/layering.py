"""Check DESIGN.md's import layering with import-linter over all stage packages at once.

import-linter needs one package tree, but ``kiln`` is spread over several distributions; this copies
every ``kiln/<stage>/`` beside the meta-package's modules into one temporary ``kiln`` package and
runs ``lint-imports`` (contracts in pyproject.toml) with it first on PYTHONPATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build_view(dest: Path) -> None:
    pkg = dest / "kiln"
    shutil.copytree(ROOT / "src" / "kiln", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    (pkg / "__init__.py").write_text("")  # the view's kiln is one plain package
    for stage_src in sorted((ROOT / "packages").glob("*/src/kiln/*")):
        if stage_src.is_dir() and stage_src.name != "__pycache__":
            shutil.copytree(stage_src, pkg / stage_src.name,
                            ignore=shutil.ignore_patterns("__pycache__"))


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        build_view(Path(tmp))
        env = dict(os.environ, PYTHONPATH=tmp)
        exe = Path(sys.executable).with_name("lint-imports")
        proc = subprocess.run([str(exe), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                              env=env, cwd=tmp, capture_output=True, text=True)
        text = proc.stdout + proc.stderr
        start = text.find("Contracts")
        print(text[start:] if start >= 0 else text)
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
