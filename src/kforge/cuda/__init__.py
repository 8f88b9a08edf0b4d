"""CUDA itself: the arch table, arch-list renderers, arch enforcement and the nvcc wrapper."""
