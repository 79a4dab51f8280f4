"""The classification task's test report: accuracy, per-class scores and the confusion matrix."""

from __future__ import annotations

from typing import Any

import numpy as np


def classification_report(y_true: np.ndarray, y_pred: np.ndarray, classes: list[str]) -> dict[str, Any]:
    """Accuracy, per-class precision/recall/F1 and the confusion matrix (rows: truth, cols: prediction).

    A class never predicted has precision 0, and one never present has recall 0: the report
    never divides by zero and never hides a class.
    """
    k = len(classes)
    cm = np.zeros((k, k), dtype=np.int64)
    np.add.at(cm, (y_true, y_pred), 1)
    tp = np.diag(cm).astype(np.float64)
    predicted = cm.sum(axis=0)
    actual = cm.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros(k), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros(k), where=actual > 0)
    denom = precision + recall
    f1 = np.divide(2 * precision * recall, denom, out=np.zeros(k), where=denom > 0)
    return {
        "accuracy": float(tp.sum() / max(cm.sum(), 1)),
        "per_class": {
            c: {
                "precision": float(precision[i]),
                "recall": float(recall[i]),
                "f1": float(f1[i]),
                "support": int(actual[i]),
            }
            for i, c in enumerate(classes)
        },
        "macro_f1": float(f1.mean()),
        "confusion_matrix": cm.tolist(),
        "classes": classes,
    }
