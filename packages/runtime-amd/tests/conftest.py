"""Makes this folder's helper module (`amd_op_suite_graphs`) importable: the suite runs in importlib mode, which puts
no test folder on sys.path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
