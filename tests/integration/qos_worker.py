"""A workload for the QoS tests: its "GPU work" is a timed critical section inside ``gpu_turn``.

python -m tests.integration.qos_worker ARBITER KEY RANK WEIGHT MIN_SHARE_MILLI MODE [SECTION_MS]
MODE: ``loop`` (a turn of SECTION_MS after another, until killed) or ``hold`` (one turn, held
forever).
"""

from __future__ import annotations

import sys
import time

from gpufrac.sdk.turns import TurnClient, gpu_turn


def main() -> None:
    arbiter, key, rank, weight, min_share, mode = sys.argv[1:7]
    section = float(sys.argv[7]) / 1000 if len(sys.argv) > 7 else 0.002
    qos = {"rank": int(rank), "weight": int(weight), "min_share_milli": int(min_share)}
    client = TurnClient(arbiter, workload=key, domain="gpu-0", qos=qos)
    while True:
        with gpu_turn(client):
            if mode == "hold":
                print("holding", flush=True)
                time.sleep(3600)
            start = time.perf_counter()
            while time.perf_counter() - start < section:
                pass


if __name__ == "__main__":
    main()
