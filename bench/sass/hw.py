"""The H200's figures the speed model uses, in one place (NVIDIA's published H200 SXM figures; HBM the copy
bandwidth measured on the project's test machine; launch and collective the latencies of a captured step)."""
from __future__ import annotations

SMS = 132                    # streaming multiprocessors
ISSUE_SLOTS = 4              # warp schedulers an SM, one warp instruction a clock each
CLOCK_HZ = 1.98e9            # boost clock
HBM_BYTES_S = 4.3e12         # HBM copy bandwidth
# L2 -> SM read bandwidth (stated, not measured here): Chips and Cheese's H100 PCIe L2 test (about 5.5 TB/s with 114
# SMs at up to 1.755 GHz; chipsandcheese.com/2023/07/02/nvidias-h100-funny-l2-and-tons-of-bandwidth) scaled by SMs
# x clock to the H200's 132 SMs at 1.98 GHz (7.2 TB/s), rounded down; launch/gpu-check should measure it
L2_BYTES_S = 7.0e12
TENSOR_BF16_FLOPS = 990e12   # dense bf16 tensor-core peak
LAUNCH_US = 2.5              # a kernel's launch inside a captured (graph) step
COLLECTIVE_US = 10.0         # one small all-reduce across the TP ranks (NVLink), per call
# per SM: register file, shared memory a block may use (plus 1 KiB the runtime reserves a block), threads, blocks
REGISTERS = 65536
SHARED_BYTES = 233472
SHARED_RESERVED = 1024
MAX_THREADS = 2048
MAX_BLOCKS = 32
WARPS_TO_ISSUE = 2           # resident warps a scheduler needs to issue every clock (see model.issue_rate)
