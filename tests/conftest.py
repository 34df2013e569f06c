"""The meta-package's tests compile into a private cache folder: kiln's graph cache must not hand
them entries from other runs (or from the user's own ~/.cache/kiln)."""

import os
import tempfile

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-tests-cache-"))
