"""The text detector: token salad and repetition in one model output -> ``TextFinding``.

``text.score_text`` is its entry: the hand-written rules (``salad``, ``repeat``, read through
``chars``, ``tokens``, ``scripts`` and ``masking``) give a windowed score, and the fitted
decision (``fitted``: the character and word models, the n-gram weights and the trees of
``detector_model.npz``) reads it with the rest of the text's features. ``coherence`` takes a
second look at the findings on agent text. The tooling that builds the corpus and fits the
model file is ``tools/detector`` at the top of the repository, never imported from here.
"""
