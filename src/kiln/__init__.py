"""kiln: a staged compiler for PyTorch programs.

``kiln.compile(model)`` captures Python bytecode into graphs (kiln.capture), traces forward and
backward ATen graphs (kiln.autograd), decomposes them (kiln.decomp), generates kernels
(kiln.inductor) and stores artifacts (kiln.runtime). See README.md.
"""

import pkgutil

# kiln is a namespace shared by every stage distribution; this makes kiln.<stage> importable whether
# the stages are installed together (this meta-package) or alone.
__path__ = pkgutil.extend_path(__path__, __name__)

from kiln.api import (  # noqa: E402
    compile,
    explain,
    load_compiled_function,
    mark_dynamic,
    reset,
)
from kiln.backends import list_backends, register_backend  # noqa: E402
from kiln.graph import set_logs  # noqa: E402
from kiln.settings import apply_env_logs  # noqa: E402

apply_env_logs()

__all__ = [
    "compile", "explain", "list_backends", "load_compiled_function", "mark_dynamic",
    "register_backend", "reset", "set_logs",
]
