# What a bf16 GEMM 8192^3 keeps of its speed beside bare copies on one GPU, by the copies' shape, in
# PyTorch alone (no Peerless): one stream or four, the copy engines (a D2D memcpy) or an SM kernel
# moving the same bytes. ag4 / ag1 are the copy-engine all-gather's bytes for 4 members (64 MiB
# each: a part into staging, then 4 parts into each result) on 4 streams / on one stream.
# GEMM time by CUDA events; each load is checked to outlast the GEMMs. 3 rounds, interleaved.
#   python3 scripts/gemm_beside_copies.py     (needs torch and a GPU with ~2 GiB free)
import torch, time
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
dev = torch.device("cuda:0"); n = 8192
A, B, C = (torch.randn(n, n, device=dev, dtype=torch.bfloat16) for _ in range(3))
gs = torch.cuda.Stream()
MiB = 1 << 20
def gemm_ms(k=30):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(gs):
        e0.record(gs)
        for _ in range(k): torch.matmul(A, B, out=C)
        e1.record(gs)
    return e0, e1
streams = [torch.cuda.Stream() for _ in range(4)]
src = [torch.empty(64 * MiB, dtype=torch.uint8, device=dev) for _ in range(4)]
stg = [torch.empty(64 * MiB, dtype=torch.uint8, device=dev) for _ in range(4)]
res = [torch.empty(256 * MiB, dtype=torch.uint8, device=dev) for _ in range(4)]
big_s, big_d = torch.empty(256 * MiB, dtype=torch.uint8, device=dev), torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
fs, fd = big_s.view(torch.float32), big_d.view(torch.float32)
def ce1():  # one stream, one 256 MiB copy
    with torch.cuda.stream(streams[0]): big_d.copy_(big_s)
    return 2 * 256 * MiB
def sm1():
    with torch.cuda.stream(streams[0]): torch.mul(fs, 1.0, out=fd)
    return 2 * 256 * MiB
def ce4x1():  # four streams, one 64 MiB copy each
    for i, s in enumerate(streams):
        with torch.cuda.stream(s): stg[i].copy_(src[i])
    return 4 * 2 * 64 * MiB
def ag4():  # four streams, the all-gather's copies by pulls: own part to staging, then 4 parts into the result
    for i, s in enumerate(streams):
        with torch.cuda.stream(s):
            stg[i].copy_(src[i])
            for k in range(4): res[i][k * 64 * MiB:(k + 1) * 64 * MiB].copy_(stg[(i + k) % 4])
    return 4 * 5 * 2 * 64 * MiB
def ag1():  # the same twenty copies on one stream
    with torch.cuda.stream(streams[0]):
        for i in range(4):
            stg[i].copy_(src[i])
            for k in range(4): res[i][k * 64 * MiB:(k + 1) * 64 * MiB].copy_(stg[(i + k) % 4])
    return 4 * 5 * 2 * 64 * MiB
loads = dict(ce1=ce1, sm1=sm1, ce4x1=ce4x1, ag4=ag4, ag1=ag1)
def per_call(f, k=10):
    f(); torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(k): b = f()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / k, b
for _ in range(3): gemm_ms(); torch.cuda.synchronize()
rows = {k: [] for k in loads}; rate = {}
for r in range(3):
    for name, f in loads.items():
        e0, e1 = gemm_ms(); torch.cuda.synchronize(); alone = e0.elapsed_time(e1)
        t, b = per_call(f); rate[name] = b / t / 1e12
        calls = int(3 * alone * 1e-3 / t) + 4
        for _ in range(calls): f()
        done = [torch.cuda.Event() for _ in streams]
        for ev, s in zip(done, streams): ev.record(s)
        e0, e1 = gemm_ms(); e1.synchronize()
        # Coverage: the load must still be running when the GEMMs end.
        covered = not all(ev.query() for ev in done)
        torch.cuda.synchronize(); beside = e0.elapsed_time(e1)
        rows[name].append(alone / beside)
        print(f"round {r} {name}: alone {alone:.1f} ms, beside {beside:.1f} ms, keeps {alone/beside:.3f}, load {rate[name]:.2f} TB/s (read+write), calls {calls}, load outlasted GEMMs {covered}", flush=True)
print("| load | HBM traffic alone (TB/s) | GEMM keeps (min-median-max) |")
for k, v in rows.items():
    v = sorted(v); print(f"| {k} | {rate[k]:.2f} | {v[0]:.3f}-{v[1]:.3f}-{v[2]:.3f} |")
