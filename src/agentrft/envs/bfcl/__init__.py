"""BFCL v4 (package bfcl-eval): the environment (`env.py`), its grader (`grader.py`), and the one module that
touches the package (`package.py`)."""
