"""Importers: traces and logs recorded elsewhere (PyTorch/Kineto JSON, ...) written into a store."""
