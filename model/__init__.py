"""Hybrid Mamba-2/attention models (families: `model.families`) with `torch` and `triton` backends.

    from model import load_pretrained, from_preset, SequenceChunk
    lm = load_pretrained("path/to/ckpt", backend="torch")      # HF config.json + safetensors, any family
    lm.logits(ids)                                            # (T, vocab), no cache
    cache = lm.allocate_cache(num_blocks, block_size, num_state_slots)
    out = lm.forward_batch([SequenceChunk(ids, 0, blocks, slot)], cache)
"""

from model.batch import BatchOutput, SequenceChunk
from model.cache import ModelCache, SSMState
from model.config import HybridConfig
from model.families import PRESETS
from model.hybrid import HybridLM
from model.loading import from_preset, init_random_weights, load_pretrained, save_pretrained

__all__ = [
    "BatchOutput", "HybridConfig", "HybridLM", "ModelCache", "PRESETS", "SSMState", "SequenceChunk",
    "from_preset", "init_random_weights", "load_pretrained", "save_pretrained",
]
