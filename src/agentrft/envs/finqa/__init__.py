"""The FinQA domain in one folder: the finqa-lite environment, the official-JSON environment, and FinQA itself.

Modules, from data to environment:

* ``corpus``     — deterministic synthetic annual reports (finqa-lite's documents)
* ``templates``  — question templates with gold FinQA programs
* ``curriculum`` — finqa-lite's tasks: levels 1–4, splits train / held-out / ood
* ``program``    — the official FinQA program language: parser, executor, execution/program accuracy
* ``symbolic``   — program accuracy's symbolic equivalence (sympy, imported only when needed)
* ``calc``       — the agent's calculator: arithmetic (the shared :mod:`agentrft.arith`) or a FinQA program
* ``tools``      — ``search`` / ``open`` / ``calculate`` over a document index
* ``env``        — :class:`~agentrft.envs.finqa.env.FinqaLiteEnv` (``finqa-lite``)
* ``expert``     — solves a finqa-lite task from its gold data through the tools (the ``oracle`` policy)
* ``dataset``    — the official FinQA JSON files as validated records
* ``json_env``   — :class:`~agentrft.envs.finqa.json_env.FinqaJsonEnv` (``finqa:PATH.json``)
* ``evaluate``   — official-style evaluation of a predictions file

Nothing is re-exported here: a grader that only needs ``program`` should not load the environments.
Program semantics follow the official FinQA evaluation script (see :mod:`agentrft.envs.finqa.program`).
"""
