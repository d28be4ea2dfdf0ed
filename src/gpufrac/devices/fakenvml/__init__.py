"""A fake NVML library over simulated GPUs, with pynvml's calls, argument shapes and error codes.

``FakeNvml`` stands where the ``pynvml`` module stands: the device adapter (``devices.nvml``) calls
the same functions on either, builds the same ctypes argument arrays from ``lib.c_nvml...`` types,
and catches ``lib.NVMLError`` by its ``value``. Behaviour follows the NVML documentation and what
was read on an
H200:

* profile info and possible placements answer whether MIG is on or off;
* GPU/compute instance create and list answer NOT_SUPPORTED while MIG is off; a placement that
  overlaps a used memory slot, or a profile at its instance limit, answers INSUFFICIENT_RESOURCES;
* destroying an instance that still has compute instances or processes answers IN_USE, and a MIG
  mode change while processes hold the GPU reports IN_USE as its activation status, leaving the
  change pending;
* per-process utilization is NOT_SUPPORTED on MIG devices (and on a GPU in MIG mode);
* GPM samples are taken on Hopper and newer only (NOT_SUPPORTED before), per GPU or per GPU
  instance, and ``nvmlGpmMetricsGet`` answers the graphics, SM and any-tensor utilization between
  two samples of one device, and the DRAM bandwidth utilization (half the graphics one, as the
  utilization rates give memory half the GPU's) (each other metric's ``nvmlReturn``
  NOT_SUPPORTED);
* a lost GPU answers GPU_IS_LOST to everything, including getting its handle.
"""

from gpufrac.devices.fakenvml.api import NVMLError
from gpufrac.devices.fakenvml.library import FakeNvml

__all__ = ["FakeNvml", "NVMLError"]
