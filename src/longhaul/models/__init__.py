"""Policies: load an HF directory, a GGUF file or a built-in name into (model, tokenizer).

Owns model/tokenizer loading and the built-in tiny test models. Does not own generation
(`longhaul.inference`) or training (`longhaul.rl`).
"""

from longhaul.models.loader import BUILTINS, cache_home, gguf_file, load_frozen, load_policy, prepare_builtin, scale_rope

__all__ = ["BUILTINS", "cache_home", "gguf_file", "load_frozen", "load_policy", "prepare_builtin", "scale_rope"]
