import os
import sys

# Tests import small helpers (toy environments) from this folder.
sys.path.insert(0, os.path.dirname(__file__))
