"""gpufrac on many machines: a control plane over node agents (docs/cluster.md)."""
