import os

os.environ.setdefault("KILN_VERIFY", "1")
