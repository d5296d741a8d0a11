"""Offline-trained interference model (IAC, spec 3.3): ONNX serving, training data, trainer.

Serving needs only onnxruntime (``load_predictor``); training (``.train``)
needs the optional ``train`` extra (torch) and is imported on demand.
"""

from elastico_extender.interference.onnx_predictor import OnnxSlowdownPredictor, load_predictor

__all__ = ["OnnxSlowdownPredictor", "load_predictor"]
