"""PyTorch symmetric-memory all-reduce on the local GPUs: the peer to compare `peerless bench` with.

Times torch.ops.symm_mem.one_shot_all_reduce and two_shot_all_reduce_ (fp32, sum),
graph-captured (20 calls per graph, median of 50 replays, slowest rank), after a correctness
check, one process per GPU. NVLink multicast stays off (TORCH_SYMM_MEM_DISABLE_MULTICAST=1).

    python3 scripts/torch_symm_bench.py --out symm.csv [--devices N] [--max-bytes B]
"""

import argparse
import csv
import os
import sys

os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

CALLS = 20
SAMPLES = 50


def worker(rank, world, sizes, out, port):
    import torch.distributed._symmetric_memory as symm_mem

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=dev)
    group = dist.group.WORLD.group_name
    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(group)
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        t = symm_mem.empty(n, dtype=torch.float32, device=dev)
        symm_mem.rendezvous(t, group)
        for algo in ("one_shot", "two_shot"):
            status = "ok"
            try:
                t.fill_(float(rank + 1))
                torch.cuda.synchronize()
                if algo == "one_shot":
                    got = torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group)
                else:
                    torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group)
                    got = t
                torch.cuda.synchronize()
                want = world * (world + 1) / 2
                if not torch.all(got == want):
                    status = f"wrong result: {got[:4].tolist()} != {want}"

                def call():
                    if algo == "one_shot":
                        torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group)
                    else:
                        t.fill_(1.0)  # keep the in-place values finite across replays
                        torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group)

                for _ in range(3):
                    call()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for _ in range(CALLS):
                        call()
                times = []
                for _ in range(SAMPLES):
                    dist.barrier()
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    g.replay()
                    b.record()
                    b.synchronize()
                    times.append(a.elapsed_time(b) * 1000.0 / CALLS)
                times.sort()
                med = torch.tensor([times[len(times) // 2]], device=dev)
            except Exception as e:  # an op missing in this PyTorch is reported, not hidden
                status = f"error: {type(e).__name__}: {e}".replace("\n", " ")[:200]
                med = torch.tensor([float("nan")], device=dev)
            dist.all_reduce(med, op=dist.ReduceOp.MAX)
            if rank == 0:
                rows.append((algo, nbytes, med.item(), status))
                print(f"{algo:>9} {nbytes:>10} B {med.item():9.2f} us  {status}", file=sys.stderr, flush=True)
    if rank == 0:
        with open(out, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["impl", "devices", "bytes", "us_median", "status"])
            for algo, nbytes, us, status in rows:
                w.writerow([f"torch-symm {algo}", world, nbytes, f"{us:.3f}", status])
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", type=int, default=torch.cuda.device_count())
    ap.add_argument("--min-bytes", type=int, default=1024)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--step", type=int, default=4)
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    sizes = []
    s = a.min_bytes
    while s <= a.max_bytes:
        sizes.append(s)
        s *= a.step
    print(f"torch {torch.__version__}, {a.devices} GPUs", file=sys.stderr)
    mp.spawn(worker, args=(a.devices, sizes, a.out, a.port), nprocs=a.devices, join=True)


if __name__ == "__main__":
    main()
