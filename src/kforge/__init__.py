"""kforge: cut wheels of GPU attention kernels for the archs, CUDA/torch versions and platforms upstream doesn't ship."""

__version__ = "0.1.0"
