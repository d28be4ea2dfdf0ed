"""Frozen values: GPU models and MIG geometry, layouts, snapshots. No I/O beyond reading package
data."""
