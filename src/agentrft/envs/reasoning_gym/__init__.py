"""reasoning-gym's procedural tasks as an environment (`env.py`) and its scorers as a grader (`grader.py`)."""
