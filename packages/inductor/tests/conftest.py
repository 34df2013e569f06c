import os
import sys
from pathlib import Path

os.environ.setdefault("KILN_VERIFY", "1")
sys.path.insert(0, str(Path(__file__).parent))
