"""The fitted decision of the text detector: the tables and trees of ``detector_model.npz``.

``charmodel`` (character n-grams of clean text), ``wordmodel`` (words and word pairs of clean
text) and ``charweights`` (learned weights of character n-grams) read a text; ``features``
turns it into one vector; ``model`` loads the file once and evaluates the trees in numpy.
The file is written by ``python -m tools.detector.train`` (scikit-learn: the ``train`` extra,
never imported here).
"""
