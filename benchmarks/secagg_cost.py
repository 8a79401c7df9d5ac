"""What SecAgg+ costs at the size `secure_sum.secagg_sizing` gives it: one start's statistics
summed under SecAgg+ against the same start sent plainly, at 100 and 1,000 in-process clients
(digits through the `pixels` encoder: 64-d features, a Gram matrix, 2,740 statistics a client).
Seconds are the set-up exchanges' on this machine (every client and the server in one process);
bytes are what one client sends and receives in the set-up exchanges.

    python benchmarks/secagg_cost.py     # benchmarks/results/secagg_cost.md
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ovalp_flwr.core.durable import replace_durably
from ovalp_flwr.federation.local_grid import run_local
from ovalp_flwr.federation.secure_sum import secagg_sizing

OUT = Path(__file__).parent / "results" / "secagg_cost.md"


def one(clients: int, aggregation: str, where: Path) -> dict:
    out = run_local({"dataset": "digits", "encoder": "pixels", "num-server-rounds": 0,
                     "feature-cache-dir": str(where / "cache"), "results-dir": str(where),
                     "run-name": f"{aggregation}-{clients}", "partition": "iid",
                     "validation-fraction": 0.0, "statistics-aggregation": aggregation},
                    clients)
    summary = json.loads((out / "summary.json").read_text())
    costs = summary["setup"]
    return {"seconds": costs["seconds"], "costs": costs, "clients": clients,
            "accuracy": summary["initial_accuracy"]}


def main() -> None:
    rows = ["| clients | shares k | threshold t | plain: s | SecAgg+: s | plain: kB up per client "
            "| SecAgg+: kB up per client | SecAgg+: kB down per client | start accuracy plain / SecAgg+ |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for clients in (100, 1000):
            plain, secure = (one(clients, kind, Path(tmp)) for kind in ("plain", "secagg+"))
            shares, threshold = secagg_sizing(clients)
            up = lambda r: r["costs"]["bytes_received"] / r["clients"] / 1e3  # noqa: E731
            down = lambda r: r["costs"]["bytes_sent"] / r["clients"] / 1e3  # noqa: E731
            rows.append(f"| {clients} | {shares} | {threshold} | {plain['seconds']:.1f} | "
                        f"{secure['seconds']:.1f} | {up(plain):.1f} | {up(secure):.1f} | "
                        f"{down(secure):.1f} | {plain['accuracy']:.4f} / {secure['accuracy']:.4f} |")
            print(rows[-1], flush=True)
    replace_durably(OUT, "# SecAgg+ sized to the clients: its cost\n\n" + __doc__.split("\n\n")[0]
               + "\n\n`python benchmarks/secagg_cost.py`\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
