"""``RopeTable`` (a growable float32 cos/sin table) and ``RotaryEmbedding`` (the nn.Module that owns one)."""

from __future__ import annotations

from typing import Optional

import torch

from .api import apply_rope
from .frequencies import _rope_type, cos_sin_table, inverse_frequencies, rope_init
from .layouts import TO_BSHD, batch_and_seq_axes
from .positions import POSITION_IDS, SEQ_OFFSETS, longest_sequence, resolve_positions

__all__ = ["RopeTable", "RotaryEmbedding"]


class RopeTable:
    """Half-width float32 cos/sin tables ``(rows, rotary_dim/2)`` built from float64 angles.

    ``ensure(n)`` grows the table (doubling) when a host-known length needs more rows. It never runs inside a CUDA
    graph capture: size it up front with ``max_positions`` for captured decode loops.

    The frequencies (``inv_freq``, float64) always stay on the CPU: they are what the table is built from. On the
    ``meta`` device the table holds shapes only; moving it to a real device builds its rows from the frequencies.
    """

    def __init__(self, rotary_dim: int, max_positions: int = 8192, *, base: float = 10000.0,
                 inv_freq: Optional[torch.Tensor] = None, attention_scaling: float = 1.0, device=None):
        self.rotary_dim = rotary_dim
        self.inv_freq = (inverse_frequencies(rotary_dim, base) if inv_freq is None
                         else inv_freq.to(device="cpu", dtype=torch.float64))
        if self.inv_freq.shape != (rotary_dim // 2,):
            raise ValueError(f"inv_freq must have shape ({rotary_dim // 2},), got {tuple(self.inv_freq.shape)}")
        self.attention_scaling = float(attention_scaling)
        # default: where a buffer would go (the default device, e.g. meta under ``with torch.device("meta")``)
        self.device = torch.device(device) if device is not None else torch.get_default_device()
        self.cos, self.sin = self._build(max_positions)

    def _build(self, rows: int):
        if self.device.type == "meta":
            shape = (rows, self.rotary_dim // 2)
            return torch.empty(shape, device="meta"), torch.empty(shape, device="meta")
        return cos_sin_table(rows, inv_freq=self.inv_freq, attention_scaling=self.attention_scaling,
                             device=self.device)

    def __len__(self) -> int:
        return self.cos.shape[0]

    def ensure(self, rows: int) -> None:
        """Make the table at least ``rows`` long (doubling, so that a growing decode rebuilds it O(log n) times)."""
        if rows > len(self):
            _refuse_in_capture(f"the cos/sin table must grow to {rows} rows")
            self.cos, self.sin = self._build(max(rows, 2 * len(self)))

    def set_frequencies(self, inv_freq: torch.Tensor, attention_scaling: float = 1.0) -> None:
        """Rebuild every row for new frequencies (the sequence-length dependent rope types change them)."""
        inv_freq = inv_freq.to(torch.float64)
        if inv_freq.shape != self.inv_freq.shape:
            raise ValueError(f"inv_freq must have shape {tuple(self.inv_freq.shape)}, got {tuple(inv_freq.shape)}")
        if torch.equal(inv_freq, self.inv_freq) and float(attention_scaling) == self.attention_scaling:
            return
        _refuse_in_capture("the cos/sin table must be rebuilt for new frequencies")
        self.inv_freq, self.attention_scaling = inv_freq, float(attention_scaling)
        self.cos, self.sin = self._build(len(self))

    def to(self, device) -> "RopeTable":
        leaving_meta = self.device.type == "meta"
        self.device = torch.device(device)
        if leaving_meta:  # a meta table has no rows to copy: build them
            self.cos, self.sin = self._build(len(self))
        else:
            self.cos, self.sin = self.cos.to(self.device), self.sin.to(self.device)
        return self


def _refuse_in_capture(what: str) -> None:
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(f"{what} inside a CUDA graph capture; create the table (RopeTable / RotaryEmbedding) with "
                           "max_positions large enough, and for the sequence-length dependent rope types (dynamic, "
                           "longrope) call it once at the longest length, before capturing")


# rope types whose frequencies depend on the current sequence length, as transformers recomputes them every forward
_SEQUENCE_DEPENDENT = ("dynamic", "longrope")


class RotaryEmbedding(torch.nn.Module):
    """Owns a float32 cos/sin table and applies RoPE to q and k.

    Args:
        head_dim: channels per head.
        rotary_dim: channels that rotate. Default: ``scaling["rotary_dim"]`` (as ``rope_parameters_from_config``
            gives it), else ``head_dim * scaling["partial_rotary_factor"]``, else head_dim.
        base: the frequency base (rope_theta): 10000, 500000, 1e6, ... (``scaling["rope_theta"]`` wins).
        scaling: a transformers ``rope_scaling``/``rope_parameters`` dict (linear, dynamic, yarn, llama3, longrope),
            or the dict of ``ropekit.rope_parameters_from_config``. Its ``max_position_embeddings`` is the model's
            context length for the scaling rules (without it: ``max_positions``).
        max_positions: rows built up front (the table grows for longer host-known lengths, never inside a graph).
        interleaved: GPT-J pairing instead of NeoX. Default: ``scaling["interleaved"]``, else False.
        backend: "triton", "cuda", "native" or None (``ropekit.device.backend_for``), as for apply_rope.

    A ``scaling`` dict with ``mrope_section`` (and ``mrope_interleaved``), as Qwen2-VL's, Qwen2.5-VL's and Qwen3-VL's
    configs give it, makes the module M-RoPE's: ``(3, batch, seq)`` positions (``(3, tokens)`` packed) are chosen per
    pair inside the kernel (``apply_rope``'s ``mrope_section``), every other position form rotates text tokens.

    ``dynamic`` and ``longrope`` change their frequencies with the sequence length, as transformers' rotary modules
    do on every forward (from ``max(position_ids) + 1``): dynamic NTK raises the base once the sequence outgrows the
    trained length (and keeps the largest length seen until a sequence fits the trained length again); longrope
    takes its long factors past the original length, its short ones otherwise. ``forward`` takes that length from
    ``seq_len`` when given, else from host-known positions (None, an int offset), else from the positions tensor
    (one host sync: pass ``seq_len`` in a decode loop, and never let it change inside a CUDA graph capture).
    ``seq_len`` (max position + 1 of the call, a host int) also grows the table for positions held in a device
    tensor, which the host never reads.
    """

    def __init__(self, head_dim: int, *, rotary_dim: Optional[int] = None, base: float = 10000.0,
                 scaling: Optional[dict] = None, max_positions: int = 8192, interleaved: Optional[bool] = None,
                 backend: Optional[str] = None, device=None):
        super().__init__()
        parameters = dict(scaling or {})
        self.head_dim = head_dim
        if rotary_dim is None:
            rotary_dim = parameters.get("rotary_dim")
        if rotary_dim is None:
            rotary_dim = int(head_dim * float(parameters.get("partial_rotary_factor") or 1.0))
        self.rotary_dim = rotary_dim
        if self.rotary_dim > head_dim or self.rotary_dim <= 0 or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even and in (0, head_dim={head_dim}], got {self.rotary_dim}")
        self.interleaved = bool(parameters.get("interleaved", False)) if interleaved is None else interleaved
        self.mrope_section = parameters.get("mrope_section")
        self.mrope_interleaved = bool(parameters.get("mrope_interleaved", False))
        self.backend = backend
        parameters.setdefault("rope_theta", base)
        self.rope_type = _rope_type(parameters)
        # the model's context length for the scaling rules; the table's rows only when the dict has none
        self.max_position_embeddings = parameters.get("max_position_embeddings") or max_positions
        self._rope_parameters = parameters
        inv_freq, attention_scaling = self._frequencies(None)
        self.table = RopeTable(self.rotary_dim, max_positions, inv_freq=inv_freq,
                               attention_scaling=attention_scaling, device=device)
        # dynamic: the longest sequence the frequencies are for (transformers' max_seq_len_cached); longrope: whether
        # the table holds the long factors
        self._frequencies_for = self.max_position_embeddings
        self._frequencies_for_long = False

    def _frequencies(self, seq_len: Optional[int]):
        return rope_init(self._rope_parameters, self.rotary_dim,
                         max_position_embeddings=self.max_position_embeddings, seq_len=seq_len)

    def update_frequencies(self, seq_len: int) -> None:
        """Frequencies for a sequence of ``seq_len`` positions (``dynamic``, ``longrope``; other types: nothing).

        Called by ``forward``; call it yourself before capturing a CUDA graph that must use a given length.
        """
        if self.rope_type == "dynamic":
            trained = self.max_position_embeddings
            if seq_len > self._frequencies_for:  # growth: a larger base for the longer sequence
                self.table.set_frequencies(*self._frequencies(seq_len))
                self._frequencies_for = seq_len
            elif seq_len < trained < self._frequencies_for:  # back within the trained length: the original base
                self.table.set_frequencies(*self._frequencies(None))
                self._frequencies_for = trained
        elif self.rope_type == "longrope":
            original = self._rope_parameters.get("original_max_position_embeddings") or self.max_position_embeddings
            long = seq_len > original
            if long != self._frequencies_for_long:  # rebuilt only when the set of factors changes
                # rope_init takes the long factors for any seq_len past the original length, the short ones for None
                self.table.set_frequencies(*self._frequencies(seq_len if long else None))
                self._frequencies_for_long = long

    def _sequence_length(self, q, positions, layout, cu_seqlens, max_seqlen) -> int:
        """max(position) + 1 over the call's tokens (a host sync only for positions in a device tensor)."""
        if layout == "thd":
            n_batch, tokens = cu_seqlens.shape[0] - 1, q.shape[0]
            length = max_seqlen
        else:
            batch_axis, seq_axis = batch_and_seq_axes(layout)
            n_batch, tokens = q.shape[batch_axis], q.shape[seq_axis]
            length = tokens
        spec = resolve_positions(batch=n_batch, seqlen=tokens, positions=positions,
                                 cu_seqlens=cu_seqlens if layout == "thd" else None, max_seqlen=max_seqlen,
                                 **self._mrope(positions, layout))
        if spec.tensor is None or spec.tensor.numel() == 0:
            return spec.offset + length
        _refuse_in_capture(f"rope_type {self.rope_type!r} needs the sequence length (pass seq_len=...); reading it "
                           "from the positions tensor is a host sync")
        if spec.mode == SEQ_OFFSETS:
            if layout == "thd":  # each packed sequence ends at its own offset + its own length
                lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(spec.tensor.device, torch.int64)
                return int((spec.tensor.reshape(-1).to(torch.int64) + lengths).max())
            return int(spec.tensor.max()) + length
        assert spec.mode == POSITION_IDS or spec.is_mrope
        return int(spec.tensor.max()) + 1

    def _apply(self, fn, recurse=True):
        # Keep the table on the module's device when the module moves (.cuda(), .to(...), .to_empty(...) after a
        # deferred init on meta: the table is then built from the frequencies, which never leave the CPU).
        result = super()._apply(fn, recurse)
        probe = fn(torch.empty(0, device=self.table.device))
        if probe.device != self.table.device:
            self.table.to(probe.device)
        return result

    def forward(self, q: torch.Tensor, k: Optional[torch.Tensor] = None, *, positions=None, layout: str = "bshd",
                cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None, inplace: bool = False,
                seq_len: Optional[int] = None):
        """Rotate q (and k) with the module's table. Returns ``(q_out, k_out)`` (``k_out`` is None when k is None).

        Args:
            q, k, positions, layout, cu_seqlens, max_seqlen, inplace: as :func:`ropekit.apply_rope`.
            seq_len: the call's max position + 1, a host int: it grows the table and picks the dynamic and longrope
                frequencies without reading a device tensor (pass it in a decode loop).
        """
        if isinstance(q, torch.Tensor) and q.is_meta:
            # Shape inference: a meta image of a table long enough for any position; the module's own table (its
            # device, its length, its frequencies) is left as it is.
            half = self.table.cos.shape[-1]
            cos = torch.empty((2**40, half), dtype=self.table.cos.dtype, device="meta").expand(2**40, half)
            return apply_rope(q, k, cos, cos, positions=positions, layout=layout, interleaved=self.interleaved,
                              rotary_dim=self.rotary_dim, inplace=inplace, cu_seqlens=cu_seqlens,
                              max_seqlen=max_seqlen, backend=self.backend, **self._mrope(positions, layout))
        if self.table.device != q.device:
            self.table.to(q.device)
        if seq_len is not None:
            if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
                raise TypeError(f"seq_len must be a non-negative host int, got {seq_len!r}")
            self.table.ensure(seq_len)  # positions in device tensors are never read by the host: grow from the hint
        elif self.rope_type in _SEQUENCE_DEPENDENT and layout in (*TO_BSHD, "thd") and (
                layout != "thd" or cu_seqlens is not None):
            if layout == "thd" and max_seqlen is None:
                max_seqlen = longest_sequence(cu_seqlens)  # one host sync, shared with apply_rope
            seq_len = self._sequence_length(q, positions, layout, cu_seqlens, max_seqlen)
            self.table.ensure(seq_len)  # it was read anyway
        if seq_len is not None and self.rope_type in _SEQUENCE_DEPENDENT:
            self.update_frequencies(seq_len)
        return apply_rope(q, k, table=self.table, positions=positions, layout=layout, interleaved=self.interleaved,
                          rotary_dim=self.rotary_dim, inplace=inplace, cu_seqlens=cu_seqlens,
                          max_seqlen=max_seqlen, backend=self.backend, **self._mrope(positions, layout))

    def _mrope(self, positions, layout: str) -> dict:
        """apply_rope's M-RoPE switches for a call whose positions are three ids per token (text calls take none, so
        that a backend without M-RoPE still rotates them)."""
        if self.mrope_section is None or not isinstance(positions, torch.Tensor) or \
                positions.ndim != (2 if layout == "thd" else 3):
            return {}
        return dict(mrope_section=self.mrope_section, mrope_interleaved=self.mrope_interleaved)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, rows={len(self.table)}, "
                f"interleaved={self.interleaved}, backend={self.backend!r}")
