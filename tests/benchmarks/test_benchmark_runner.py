"""The benchmark runner end to end on a tiny sweep, and the pieces it is made of."""

import csv
import json
import struct
import time

import pytest
import torch

from brickwork.benchmarks.layer_norm import BENCH as LAYER_NORM
from brickwork.benchmarks.report import device_slug, markdown_table, merge_rows, write_plot
from brickwork.benchmarks.runner import BENCHES, main
from brickwork.benchmarks.selection import KERNELS
from brickwork.benchmarks.timing import _sleep_cycles_per_ms, mode_step, time_case, time_ms

TINY = [
    "--widths",
    "64",
    "--rows",
    "8",
    "--dtypes",
    "float32",
    "--providers",
    "brickwork",
    "torch",
    "--no-plot",
]


def _load(out):
    (json_path,) = out.glob("*.json")
    return json_path, json.loads(json_path.read_text())


def test_run_writes_json_csv_and_markdown(tmp_path, capsys):
    gpu = torch.cuda.is_available()
    assert main(["--kernels", "layer_norm", "masked_softmax", "--out", str(tmp_path), *TINY]) == 0
    assert ("No GPU present" in capsys.readouterr().out) != gpu
    json_path, data = _load(tmp_path)
    assert json_path.stem == device_slug(data["device"]) and data["device"].startswith("CPU") != gpu
    assert data["gpu_present"] is gpu and data["versions"]["torch"] == torch.__version__
    rows = data["results"]
    assert len(rows) == 2 * 2 * 3  # kernels x providers x modes
    for row in rows:
        assert row["error"] is None and row["ms_p20"] <= row["ms"] <= row["ms_p80"]
        bytes_moved = BENCHES[row["kernel"]].bytes_moved(row["mode"], 8, 64, torch.float32)
        assert row["gbps"] == pytest.approx(bytes_moved / (row["ms"] * 1e-3) / 1e9)
        assert row["bandwidth_fraction"] == pytest.approx(row["gbps"] / data["copy_bandwidth_gbps"])
    with json_path.with_suffix(".csv").open() as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    table = json_path.with_suffix(".md").read_text()
    assert ("No GPU present" in table) != gpu and "| layer_norm | backward | float32 | 64 |" in table


def test_runs_merge_unless_fresh(tmp_path):
    main(["--kernels", "rms_norm", "--out", str(tmp_path), *TINY])
    main(["--kernels", "rms_norm", "--out", str(tmp_path), *TINY, "--widths", "32"])
    assert {r["width"] for r in _load(tmp_path)[1]["results"]} == {32, 64}
    main(["--kernels", "rms_norm", "--out", str(tmp_path), *TINY, "--fresh", "--modes", "backward"])
    rows = _load(tmp_path)[1]["results"]
    assert {(r["width"], r["mode"]) for r in rows} == {(64, "backward")} and len(rows) == 2


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        main(["--widths", "0"])
    with pytest.raises(SystemExit):
        main(["--kernels", "layernorm"])


def _row(provider, ms, fraction, width=4096, mode="forward"):
    return {
        "kernel": "layer_norm",
        "provider": provider,
        "dtype": "bfloat16",
        "rows": 4096,
        "width": width,
    } | {"mode": mode, "ms": ms, "gbps": 3000 * fraction, "bandwidth_fraction": fraction}


def test_markdown_verdicts_on_a_gpu_run():
    meta = {"gpu_present": True}
    rows = [
        _row("brickwork", 0.10, 0.93),
        _row("torch", 0.20, 0.50),
        _row("brickwork", 0.10, 0.80, width=8192),  # below the 90% forward target
        _row("torch", 0.20, 0.40, width=8192),
        _row("brickwork", 0.30, 0.70, width=1024),  # no bandwidth target at 1024, but slower than torch
        _row("torch", 0.20, 0.90, width=1024),
    ]
    lines = {line.split(" | ")[3]: line for line in markdown_table(meta, rows, BENCHES).splitlines()[2:]}
    assert lines["4096"].endswith("| 2.00 | >= 90% BW, > torch | yes |")
    assert lines["8192"].endswith("| >= 90% BW, > torch | **no** |")
    assert lines["1024"].endswith("| 0.67 | > torch | **no** |")


def test_markdown_shows_host_time_where_it_was_measured_apart():
    rows = [_row("brickwork", 0.10, 0.93) | {"host_ms": 0.012}, _row("torch", 0.20, 0.50) | {"host_ms": 0.02}]
    head, _, line = markdown_table({"gpu_present": True}, rows, BENCHES).splitlines()
    assert "| brickwork host µs | torch host µs |" in head and "| 12 | 20 |" in line
    cpu_rows = [_row("brickwork", 0.10, 0.93) | {"host_ms": None}]
    assert "host µs" not in markdown_table({"gpu_present": False}, cpu_rows, BENCHES)


def test_cpu_timing_is_all_host_time():
    timing = time_case(lambda: sum(range(1000)), torch.device("cpu"))
    assert timing.host_ms is None and 0 < timing.ms_p20 <= timing.ms <= timing.ms_p80


@pytest.mark.gpu
def test_gpu_timing_tells_device_time_from_host_time():
    # 2 ms of GPU work enqueued in microseconds, then 2 ms of host work around a tiny kernel.
    cycles = int(_sleep_cycles_per_ms(torch.cuda.current_device()) * 2)
    device_bound = time_case(lambda: torch.cuda._sleep(cycles), torch.device("cuda"))
    assert 1.6 < device_bound.ms < 2.5 and device_bound.host_ms < 0.5
    x = torch.ones(16, device="cuda")

    def host_bound() -> None:
        deadline = time.perf_counter() + 2e-3
        while time.perf_counter() < deadline:
            pass
        x.add_(1)

    timing = time_case(host_bound, torch.device("cuda"))
    assert timing.ms < 0.5 and 1.9 < timing.host_ms < 3


def test_merge_replaces_only_remeasured_cases():
    old = [_row("brickwork", 1.0, 0.1), _row("torch", 1.0, 0.1)]
    new = [_row("brickwork", 0.5, 0.2)]
    merged = merge_rows(old, new)
    assert [(r["provider"], r["ms"]) for r in merged] == [("torch", 1.0), ("brickwork", 0.5)]


def test_modes_time_what_they_say():
    x, w, b = LAYER_NORM.make_inputs(4, 16, torch.float32, torch.device("cpu"))
    fn = LAYER_NORM.providers["torch"](torch.device("cpu"))
    step, leaves = mode_step(fn, [x, w, b], "backward")
    assert leaves == [x, w, b] and x.grad is None
    step()
    assert x.grad is not None and w.grad is not None
    with pytest.raises(ValueError, match=r"unknown mode 'sideways'"):
        mode_step(fn, [x, w, b], "sideways")
    median, low, high = time_ms(step, torch.device("cpu"), leaves)
    assert 0 < low <= median <= high


def test_the_plot_has_panels_only_for_the_modes_that_ran(tmp_path):
    rows = [_row("brickwork", 0.10, 0.93), _row("torch", 0.20, 0.50)]
    assert write_plot(tmp_path / "plot.png", {"device": "test", "copy_bandwidth_gbps": 3000.0}, rows)
    width, height = struct.unpack(">II", (tmp_path / "plot.png").read_bytes()[16:24])
    # One kernel x one mode: a single 4.5 x 3.2 inch panel at 80 dpi, not a row of three.
    assert (width, height) == (360, 256)


def test_the_selection_flags_name_every_kernel_benchmark():
    assert tuple(BENCHES) == KERNELS
