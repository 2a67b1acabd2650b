"""Printing the rows as a table (a ratio as its median over rounds and [min, max]) and plotting the conv and layers
suites' sweeps."""

def _format(value):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, int) and abs(value) >= 10 ** 6:
        return f"{value:.3g}"
    return str(value)


def _with_range(median, low_high):
    """"0.85 [0.80, 0.90]": a median ratio and the smallest and largest round's."""
    if median is None:
        return "-"
    return f"{median:.2f} [{low_high[0]:.2f}, {low_high[1]:.2f}]"


# columns made of two fields: the median over rounds with its [min, max]
COMBINED = {"ratio [min, max]": lambda row: _with_range(row.get("median_ratio"), row.get("ratio_range")),
            "over_floor [min, max]": lambda row: _with_range(row.get("median_over_floor"), row.get("over_floor_range"))}


def print_table(rows, columns):
    table = [columns] + [[COMBINED[column](row) if column in COMBINED else _format(row.get(column))
                          for column in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)))


COLOURS = {"direct": "tab:red", "im2col": "tab:blue", "fft": "tab:green", "winograd": "tab:purple", "auto": "tab:gray",
           "PyTorch": "tab:orange", "minidl cpu": "tab:blue", "minidl gpu": "tab:green"}


def plot(rows, suite, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = {"conv": [("channels", "channels (in = out), batch 16, 32x32, 3x3"),
                       ("kernel", "kernel size, batch 8, 16 -> 16 channels, 64x64")],
              "layers": [("conv", "channels (in = out), batch 32, 32x32, 3x3"),
                         ("fc", "width (in = out), batch 128")]}[suite]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, (sweep, label) in zip(axes, panels):
        chosen = [row for row in rows if row.get("sweep") == sweep]
        lines = {}
        for row in chosen:
            name = f"{row['algorithm']} ({row['device']})" if suite == "conv" else f"minidl {row['device']}"
            if suite == "layers" and row["device"] == "gpu":
                name = "minidl gpu (CuPy)"
            lines.setdefault(name, []).append((row["x"], row["minidl_ms"]))
            if row["torch_ms"] is not None:
                lines.setdefault("PyTorch (cpu)", []).append((row["x"], row["torch_ms"]))
        for name, points in lines.items():
            points = sorted(set(points))
            axis.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name,
                      color=COLOURS.get(name.split(" (")[0]))
        axis.set_xlabel(label)
        axis.set_ylabel("forward + backward, ms")
        axis.set_yscale("log")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle(f"minidl.bench {suite}: float32, {rows[0]['threads']} thread(s)"
                    + ("" if any(row["device"] == "gpu" for row in rows) else "; GPU not measured (none present)"))
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


MAIN_COLUMNS = ["case", "minidl_ms", "torch_ms", "ratio [min, max]", "gflops", "gemm_fraction", "target", "met"]
CONV_COLUMNS = ["case", "algorithm", "device", "minidl_ms", "torch_ms", "ratio [min, max]", "gflops",
                "multiplies_fwd_bwd",
                "extra_elements", "auto_choice", "fastest"]
SWEEP_COLUMNS = ["case", "batch", "device", "minidl_ms", "torch_ms", "ratio [min, max]", "floor_ms",
                 "over_floor [min, max]", "target", "met"]
LAYERS_COLUMNS = ["case", "device", "minidl_ms", "torch_ms", "ratio [min, max]", "gflops", "gemm_fraction",
                  "cpu_over_gpu"]
