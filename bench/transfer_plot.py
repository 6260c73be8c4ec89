#!/usr/bin/python3
"""Plots nxmem_transfer_bench's JSON: bandwidth against block size, one panel per transport,
nxmem's reads and writes beside ucx_perftest's ucp_get and ucp_put_bw of the same run.

    python3 bench/transfer_plot.py transfer.json transfer.png

Needs Debian's python3-matplotlib (scripts/lib/deps.sh installs it)."""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display: write the file
import matplotlib.pyplot as plt  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as source:
        document = json.load(source)
    transports = document.get("transports", {})
    if not transports:
        print("no transports in " + sys.argv[1], file=sys.stderr)
        return 1
    figure, axes = plt.subplots(1, len(transports), figsize=(6 * len(transports), 4.5), squeeze=False)
    for axis, (tls, figures) in zip(axes[0], sorted(transports.items())):
        for op, style in (("read", "o"), ("write", "s")):
            rows = [row for row in figures["rows"] if row["op"] == op]
            sizes = [row["size"] for row in rows]
            axis.plot(sizes, [row["nxmem_bytes_per_second"] / 2**20 for row in rows], "-" + style,
                      label="nxmem " + op)
            ran = [row for row in rows if row["perftest_ran"]]
            axis.plot([row["size"] for row in ran], [row["perftest_bytes_per_second"] / 2**20 for row in ran],
                      "--" + style, label=ran[0]["baseline"] if ran else "ucx_perftest (did not run)")
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("block size (bytes)")
        axis.set_ylabel("MiB/s")
        axis.set_title("UCX_TLS=" + tls)
        axis.grid(True, which="both", alpha=0.3)
        axis.legend(fontsize="small")
    figure.suptitle("nxmem transfer against ucx_perftest, one run (ratios are what to compare)")
    figure.tight_layout()
    figure.savefig(sys.argv[2], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
