"""Pure functions from snapshots to plans: MIG layouts, placement, preemption, quotas."""
