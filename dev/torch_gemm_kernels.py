# Each product of dev/peers.py gemm at one shape, twice, so that a profiler names the
# kernels torch runs (BF16 matmul, torch._scaled_mm per tensor / row / block):
#   ncu --kernel-name regex:"nvjet|sm90|gemm|cutlass" --metrics sm__cycles_elapsed.max \
#       python3 dev/torch_gemm_kernels.py 8192x4096x4096
# (GPU machine only; the same tensors and scales as peers.py.)
import sys

import torch

M, N, K = map(int, sys.argv[1].split("x"))
dev = torch.device("cuda")
a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
b = torch.randn(N, K, device=dev, dtype=torch.bfloat16)
a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
one = torch.tensor(1.0, device=dev)
scales = [(one, one),
          (torch.ones(M, 1, device=dev), torch.ones(1, N, device=dev)),
          (torch.ones(M, K // 128, device=dev).t().contiguous().t(), torch.ones(N // 128, K // 128, device=dev).t())]
for _ in range(2):
    a @ b.t()
for sa, sb in scales:
    for _ in range(2):
        torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
torch.cuda.synchronize()
