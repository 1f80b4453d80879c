"""NCCL Inspector's files in a job folder (docs/report.md, "NCCL Inspector"; the format and
where trainprof looks: docs/formats.md, "NCCL Inspector"), read by the real `trainprof report`:
two ranks of one communicator written as the plugin writes them, rank 1 planted slow, and a
hostile file beside them that costs one count, not the report."""

import html
import json
import pathlib
import subprocess

T0 = 1_795_400_000


def record(rank, host, pid, sn, exec_us):
    return {
        "header": {"id": "0xe62dedaa97644a", "rank": rank, "n_ranks": 2, "nnodes": 2},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "git_rev": "",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": T0 * 1_000_000 + sn,
            "hostname": host,
            "pid": pid,
        },
        "coll_perf": {
            "coll": "ReduceScatter" if sn % 3 == 0 else "AllReduce",
            "coll_sn": sn,
            "coll_msg_size_bytes": 2_097_152,
            "coll_exec_time_us": exec_us,
            "coll_timing_source": "kernel_gpu",
            "coll_algobw_gbs": 100.0,
            "coll_busbw_gbs": 150.0 if rank == 0 else 30.0,
        },
    }


def job(root: pathlib.Path) -> pathlib.Path:
    system = root / "system" / "incremental" / "2026112203"
    system.mkdir(parents=True)
    line = '{{"Type":"cpu","Name":"cpu0","Dimension":"CPUUtilization","Value":5,"NodeId":"algo-1","Timestamp":{}}}\n'
    (system / f"{T0}.algo-1.json").write_text(line.format(T0) + line.format(T0 + 1))
    folder = root / "nccl-inspector"
    folder.mkdir()
    for rank, host, pid, base_us in [(0, "node-a", 4100, 300), (1, "node-b", 4200, 2400)]:
        lines = [json.dumps(record(rank, host, pid, sn, base_us + sn), separators=(",", ":")) for sn in range(30)]
        (folder / f"{host}-pid{pid}.log").write_text("\n".join(lines) + "\n")
    # A third process's file of garbage, deep nesting and a cut record.
    (folder / "node-c-pid4300.log").write_text("garbage\n" + "[" * 100_000 + "\n" + '{"header":{"id"')
    return root


def test_report_reads_inspector_files(tmp_path, trainprof_bin):
    root = job(tmp_path / "job")
    page = tmp_path / "page.html"
    proc = subprocess.run(
        [str(trainprof_bin), "report", str(root), "--json", "-o", str(page)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    ins = json.loads(proc.stdout)["nccl_inspector"]
    assert (ins["files"], ins["records"], ins["matched"]) == (3, 60, 30)
    assert ins["bad_records"] >= 2
    assert [c["processes"] for c in ins["communicators"]] == [2]
    rows = {r["host"]: r for r in ins["per_rank"]}
    assert rows["node-b"]["gpu_time_ms"] == sum(2400 + sn for sn in range(30)) / 1000
    assert rows["node-b"]["kinds"] == {"AllReduce": 20, "ReduceScatter": 10}
    assert rows["node-a"]["mean_busbw_gbs"] == 150.0
    assert (rows["node-b"]["longest"], rows["node-a"]["shortest"]) == (30, 30)
    assert rows["node-c"]["collectives"] == 0
    slow = ins["slowest"]
    assert (slow["host"], slow["pid"], slow["rank"]) == ("node-b", 4200, 1)
    assert ins["exec_spread_ms"]["max_ms"] == 2.1

    text = page.read_text()
    section = text.split('<section id="collectives">', 1)[1].split("</section>", 1)[0]
    assert '<h3 id="nccl-inspector">NCCL Inspector</h3>' in section
    assert "Most execution time: rank 1 (node-b pid 4200)" in html.unescape(section)
    assert '<tr class="straggler"><td>node-b</td>' in section
