"""The node's side effects: changing MIG, and (later) running and supervising workloads."""
