"""Recipes built on the library: the demo (`agentrft demo`, any environment from rewards alone), the agentic
recipe (`agentrft demo --agentic`) and its probe of the expert's demonstrations under a policy."""
