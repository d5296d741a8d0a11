"""Offline-trained interference model (ONNX), its training data loader and trainer."""
