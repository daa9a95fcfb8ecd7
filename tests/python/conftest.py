import sys
from pathlib import Path

# Lets the tests import their helper modules (families.py) by name.
sys.path.insert(0, str(Path(__file__).parent))
