"""Rotary position embeddings (RoPE) for the engine's model runner, with the scalings HF configs ask for.

Owns the inverse frequencies and attention factor of each RoPE type (pure functions registered
by name, picked by the config's `rope_type`), a cos/sin table so a decode step is one
`index_select`, and the rotation of queries and keys. Does not own attention or the KV cache.

Supported types: default, linear, dynamic (NTK-aware), yarn, llama3; the maths follows
`transformers.modeling_rope_utils` in float32, operation for operation, so the tables equal
HF's. Not supported (a `LonghaulError` says so): longrope and other types, partial rotary
(`partial_rotary_factor` < 1) and per-layer-type RoPE dicts.

One deviation from HF: dynamic NTK is stateless here. HF's rotary module keeps the frequencies
of the longest sequence it has seen (until it sees one within the original length); `cos_sin`
recomputes them from max(positions) + 1 on every call, which equals HF for a forward over
positions 0..L-1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from longhaul.errors import LonghaulError

# A RoPE type: (normalised rope params, rotary dim, seq_len) -> (inv_freq (dim/2,), attention factor).
RopeFn = Callable[[dict, int, "int | None"], tuple[torch.Tensor, float]]
ROPE_TYPES: dict[str, RopeFn] = {}


def _register(name: str) -> Callable[[RopeFn], RopeFn]:
    def wrap(fn: RopeFn) -> RopeFn:
        ROPE_TYPES[name] = fn
        return fn

    return wrap


def _theta_powers(base: float, dim: int) -> torch.Tensor:
    """base^(2i/dim) for i < dim/2: the wavelengths over 2*pi, float32 (dim/2,)."""
    return base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


@_register("default")
def _default(p: dict, dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    return 1.0 / _theta_powers(p["rope_theta"], dim), 1.0


@_register("linear")
def _linear(p: dict, dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    # Dividing positions by the factor is the same as dividing the frequencies.
    return (1.0 / _theta_powers(p["rope_theta"], dim)) / p["factor"], 1.0


@_register("dynamic")
def _dynamic(p: dict, dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    # NTK-aware: past the trained length the base grows so the lowest frequency stretches to
    # cover seq_len; within it (seq_len clamped up to max positions) the base is unchanged.
    max_pos = p["max_position_embeddings"]
    seq_len = max(seq_len or max_pos, max_pos)
    factor = p["factor"]
    base = p["rope_theta"] * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    return 1.0 / _theta_powers(base, dim), 1.0


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_dim(rotations: float, dim: int, base: float, max_pos: int) -> float:
    """The (fractional) rotary dim whose wavelength fits `rotations` times in max_pos."""
    return dim * math.log(max_pos / (rotations * 2 * math.pi)) / (2 * math.log(base))


@_register("yarn")
def _yarn(p: dict, dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    # YaRN (arXiv 2309.00071): high-frequency dims keep their frequency (extrapolate),
    # low-frequency dims are divided by the factor (interpolate), a linear ramp in between;
    # cos and sin are scaled by the attention factor ("mscale").
    base, original = p["rope_theta"], p["original_max_position_embeddings"]
    factor = p.get("factor") or p["max_position_embeddings"] / original
    attention = p.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = p.get("mscale"), p.get("mscale_all_dim")
        if mscale and mscale_all_dim:  # DeepSeek style: a ratio of two mscales
            attention = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention = _yarn_mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1
    low, high = _yarn_dim(beta_fast, dim, base, original), _yarn_dim(beta_slow, dim, base, original)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp  # weight of the unscaled frequency, 1 for the fast dims
    powers = _theta_powers(base, dim)
    inv_freq = (1.0 / (factor * powers)) * (1 - extrapolated) + (1.0 / powers) * extrapolated
    return inv_freq, float(attention)


@_register("llama3")
def _llama3(p: dict, dim: int, seq_len: int | None) -> tuple[torch.Tensor, float]:
    # Llama 3.1: wavelengths longer than original/low_freq_factor are divided by the factor,
    # shorter than original/high_freq_factor kept, and smoothly blended in between.
    inv_freq = 1.0 / _theta_powers(p["rope_theta"], dim)
    factor, low_ff, high_ff = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    is_long, is_short = wavelen > original / low_ff, wavelen < original / high_ff
    scaled = torch.where(is_long, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_ff) / (high_ff - low_ff)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    return torch.where(~is_long & ~is_short, blended, scaled), 1.0


def rope_params(config) -> dict:
    """The config's RoPE parameters as one flat dict with rope_type, rope_theta and max positions.

    Reads transformers 5's `rope_parameters`, falling back to the legacy `rope_scaling` and
    `rope_theta` fields, without changing the config.
    """
    raw = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if any(isinstance(v, dict) for v in raw.values()):
        raise LonghaulError(
            f"per-layer RoPE parameters ({sorted(raw)}) are not supported; use one RoPE for all layers"
        )
    p = dict(raw)
    p.setdefault("rope_type", p.get("type", "default"))
    if p.get("rope_theta") is None:
        p["rope_theta"] = getattr(config, "rope_theta", None) or getattr(config, "default_theta", 10000.0)
    p["max_position_embeddings"] = config.max_position_embeddings
    if p["rope_type"] in ("yarn", "llama3"):
        # Like HF: a top-level original_max_position_embeddings (Phi-3 style) wins.
        top = getattr(config, "original_max_position_embeddings", None)
        original = top or p.get("original_max_position_embeddings")
        p["original_max_position_embeddings"] = original or config.max_position_embeddings
    partial = p.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    if partial not in (None, 1.0):
        raise LonghaulError(
            f"partial rotary (partial_rotary_factor={partial}) is not supported; only full-head RoPE is"
        )
    return p


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_init(config, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    """(inv_freq (D/2,) float32 on CPU, attention_scaling) for the config's RoPE type.

    seq_len matters only for dynamic NTK (the length being processed); None means at most the
    trained length, i.e. the unscaled frequencies.
    """
    p = rope_params(config)
    fn = ROPE_TYPES.get(p["rope_type"])
    if fn is None:
        raise LonghaulError(f"RoPE type {p['rope_type']!r} is not supported; supported types: {', '.join(ROPE_TYPES)}")
    return fn(p, head_dim(config), seq_len)


def _cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]  # (N, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (N, D), HF's half-split layout
    return emb.cos() * scale, emb.sin() * scale


class Rope:
    """cos/sin tables for a config's RoPE, scaled by its attention factor.

    The tables cover positions [0, max_positions) (default: the config's max_position_embeddings;
    at head_dim 128 that is 1 KiB a position); positions past them are an index error, except for
    dynamic NTK, which computes lengths past the trained length directly.
    """

    def __init__(self, config, device=None, max_positions: int | None = None):
        self.config = config
        self.rope_type = rope_params(config)["rope_type"]
        self.inv_freq, self.attention_scaling = rope_init(config)
        self.original_max_positions = config.max_position_embeddings
        if self.rope_type == "dynamic":  # the table holds only the unscaled lengths
            max_positions = self.original_max_positions
        self.max_positions = max_positions or config.max_position_embeddings
        positions = torch.arange(self.max_positions, device=device)
        self._cos, self._sin = _cos_sin(positions, self.inv_freq, self.attention_scaling)  # (P, D) each

    @property
    def tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (max_positions, D) float32: the rows `cos_sin` reads for positions below
        max_positions."""
        return self._cos, self._sin

    def cos_sin(self, positions: torch.LongTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions (N,) -> cos (N, D), sin (N, D), float32, on positions' device."""
        if self._cos.device != positions.device:
            self._cos, self._sin = self._cos.to(positions.device), self._sin.to(positions.device)
        if self.rope_type == "dynamic" and positions.numel():
            seq_len = int(positions.max()) + 1  # one host sync, dynamic only
            if seq_len > self.original_max_positions:
                return _cos_sin(positions, *rope_init(self.config, seq_len))
        return self._cos.index_select(0, positions), self._sin.index_select(0, positions)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(..., D) -> (-x[D/2:], x[:D/2]): the rotation by 90 degrees in HF's half-split layout."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, H, D) rotated by cos, sin (N, D); same shape and dtype as x.

    cos and sin are cast to x's dtype first, as HF's rotary embedding does, so bf16 models see
    the same rounding as under HF.
    """
    cos = cos.to(x.dtype)[:, None, :]  # (N, 1, D)
    sin = sin.to(x.dtype)[:, None, :]
    return x * cos + rotate_half(x) * sin
