"""The fleet tests import their process launcher (fleet_processes.py) from this folder."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
