"""What every implementation of an op agrees on: argument checks, output types, shared host tables.

The Triton kernels, the PyTorch oracles (`kernels.reference`) and the CPU paths
(`kernels.torch_cpu`) all validate through these functions, so they accept and reject exactly
the same inputs with the same messages. One module per op family:

* `tensors`: the dtypes an op takes and `check_tensor` (type, shape pattern, dtype, device).
* `varlen`: packed sequences (`cu_seqlens`), capture offsets, state-pool slots, logical chunks.
* `ssd`: the Mamba-2 SSD scan and decode step (and dt', their step size).
* `conv1d`: the causal depthwise conv1d and its decode step.
* `gated_delta`: the gated delta rule (Gated DeltaNet) scan and decode step.
* `paged_attention`: the paged KV cache layout, the KV write and the attention call.
"""
