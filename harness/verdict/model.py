"""The fitted decision: the detector's model file, loaded once, evaluated in numpy.

``detector_model.npz`` (next to this module) holds the character model's tables, the
feature scaler, the weights of a small neural network (ReLU hidden layers, a softmax over
clean / salad / repetition) and two thresholds on P(corrupted), both chosen on a validation
split for the false-positive goal: one for every text, a lower one for the texts where the
hand-written rules fired (they are evidence the network weighs, and where they are silent
only the network speaks). It is written by ``benchmarks/train_detector.py`` (scikit-learn,
a training dependency only: nothing here imports it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from harness.errors import ConfigError
from harness.verdict import features
from harness.verdict.charmodel import CharModel

MODEL_FILE = Path(__file__).with_name("detector_model.npz")
CLASSES = ("clean", "salad", "repetition")
#: Standardized features are clipped to +-CLIP (in training too): a value far outside what
#: the network saw (a rare rule signal at 90 standard deviations) must not swing it anywhere.
CLIP = 4.0


@dataclass(frozen=True)
class DetectorModel:
    version: str
    chars: CharModel
    mean: npt.NDArray[np.float64]
    scale: npt.NDArray[np.float64]
    weights: tuple[npt.NDArray[np.float64], ...]
    biases: tuple[npt.NDArray[np.float64], ...]
    threshold: float
    threshold_rules: float  # when the hand-written rules fired

    def proba(self, x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
        """P(clean), P(salad), P(repetition) of one feature vector."""
        h = np.clip((x - self.mean) / self.scale, -CLIP, CLIP)
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w + b
            if i < last:
                h = np.maximum(h, 0.0)
        e = np.exp(h - h.max())
        p: npt.NDArray[np.float64] = e / e.sum()
        return p


def read(path: Path) -> DetectorModel:
    try:
        z = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot read the detector model {path} ({exc}); rebuild it with "
            "python benchmarks/train_detector.py"
        ) from None
    names = tuple(str(n) for n in z["names"])
    if names != features.NAMES:
        raise ConfigError(
            f"the detector model {path} was fit on other features; rebuild it with "
            "python benchmarks/train_detector.py"
        )
    n = int(z["layers"])
    return DetectorModel(
        version=str(z["version"]),
        chars=CharModel(z["t2"], z["t3"], z["t4"], np.unpackbits(z["t6"])),
        mean=z["mean"].astype(np.float64),
        scale=z["scale"].astype(np.float64),
        weights=tuple(z[f"w{i}"].astype(np.float64) for i in range(n)),
        biases=tuple(z[f"b{i}"].astype(np.float64) for i in range(n)),
        threshold=float(z["threshold"]),
        threshold_rules=float(z["threshold_rules"]),
    )


@functools.cache
def load() -> DetectorModel:
    """The shipped model, read on first use."""
    return read(MODEL_FILE)


__all__ = ["CLASSES", "MODEL_FILE", "DetectorModel", "load", "read"]
