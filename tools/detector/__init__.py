"""Building, fitting and measuring the text detector (``harness.verdict.detector``).

Run from the repository's root:

* ``python -m tools.detector.smollm``: real outputs of SmolLM2-135M for the corpus
  (llama.cpp: the ``llamacpp`` extra);
* ``python -m tools.detector.corpus``: the corpus: clean texts from real sources and the
  corruption made of them (more sources with the ``corpus`` extra);
* ``python -m tools.detector.corruptgen``: labelled corrupted examples from clean seeds (the
  project's evaluation sets, ``tests/data/eval``);
* ``python -m tools.detector.train``: the model file the package ships (scikit-learn: the
  ``train`` extra);
* ``python -m tools.detector.evaluate``: quality per class and speed on labelled files;
* ``python -m tools.detector.ab``: this checkout's detector against a git revision's;
* ``python -m tools.detector.cassettes``: a held-out set of real agent turns, recorded in the
  HTTP cassettes of LLM libraries' source distributions (``benchmarks/agent_turns.py``).

The heavy libraries are imported where a command needs them, never at import time.
"""
