"""gpufrac: share NVIDIA GPUs between AI workloads safely and fast."""

__version__ = "0.1.0"
