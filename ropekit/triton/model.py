"""The performance model: from a GPU's facts and a call's shape to a launch configuration.

RoPE moves bytes and does almost no arithmetic, so a launch is good when it keeps the memory system busy. Four
questions decide it, each answered here from :class:`DeviceFacts`:

* **Bytes in flight (Little's law).** DRAM delivering ``B`` bytes a second with a loaded latency ``L`` holds
  ``B x L`` bytes in flight; split over the SMs, each SM must keep ``B / SMs x L`` bytes of loads outstanding at every
  moment (:attr:`DeviceFacts.needed_bytes_in_flight_per_sm`). A program has in flight what it loads before it waits
  on any of it; an SM holds as many programs at once as its warp slots, program slots and registers allow
  (:func:`resident_programs`). :func:`predicted_pct` is the fraction of the copy ceiling this predicts.
* **Residency and registers.** A thread holding more values than the registers an SM gives each thread at full
  residency (``registers_per_sm / (32 x max_warps_per_sm)``) costs residency or spills; :func:`register_budget`.
* **Waves.** A short call must still give every SM work: a grid of fewer than two programs an SM leaves SMs idle.
* **The launch between calls.** A short call is mostly its launch. On compute capability 9.0 and later a launch
  may begin before the grid ahead of it has finished, its programs waiting for that grid's end before they touch
  memory (programmatic dependent launch); a small grid also lets the grid after it begin early
  (:func:`grid_dependency`).
* **Instructions a byte.** An SM issues at most :data:`ISSUE_PER_SM_CYCLE` thread instructions a cycle; at the copy
  ceiling it moves ``ceiling / SMs / clock`` bytes a cycle, so a kernel may spend :func:`issue_slots_per_byte`
  instructions on each byte it moves. A kernel whose instructions a byte need most of those slots
  (:func:`issue_share_needed`) cannot reach the ceiling, since its warps also wait on their loads: it is bound by its
  instructions, not its bytes. No tile changes that; fewer instructions an element do.
* **Where the bytes live.** A call whose bytes (read and written) fit in the L2 cache is served by the L2, where
  every request counts, so table rows fetched once a token (a tile) beat rows fetched once a head vector (the
  flat kernel). A call larger than the L2 streams from DRAM, where table rows are L2 hits and cost nothing; there
  the flat kernel (runs of whole head vectors, each NeoX pair loaded once) keeps the most bytes in flight for the
  fewest instructions.

:func:`model_rope` and :func:`model_fused` turn these into a :class:`~ropekit.triton.configs.TileConfig`,
:class:`~ropekit.triton.configs.FlatConfig` or :class:`~ropekit.triton.configs.FusedConfig`;
:func:`rope_candidates` and :func:`fused_candidates` list a few neighbours for the autotune
(:mod:`ropekit.triton.choice`), drawn from :func:`rope_candidate_space` / :func:`fused_candidate_space`, the whole
set of configurations the model and the autotune can reach. docs/tuning.md explains each rule with its measurement.

Pure arithmetic: nothing here touches a GPU, so the course (:mod:`ropekit.course.perf_model`) teaches these very
functions on any machine.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from .configs import FlatConfig, FusedConfig, FusedShape, RopeShape, TileConfig, cdiv, flat_rows, next_pow2
from .groups import Dependency

__all__ = ["DeviceFacts", "Launch", "WARPS", "resident_programs", "bytes_in_flight_per_sm", "predicted_pct",
           "fit_latency_ns", "register_budget", "THREAD_BYTES", "tile_values_max", "fits_in_l2", "model_rope",
           "model_fused", "rope_candidates", "fused_candidates", "rope_candidate_space", "fused_candidate_space",
           "is_valid_rope", "is_valid_fused", "DECODE_TOKENS", "flat_bytes_in_flight_per_sm",
           "flat_meets_littles_law", "streaming_tile", "tile_bytes_in_flight_per_sm", "fused_bytes_in_flight_per_sm",
           "fused_meets_littles_law", "prefill_past_l2", "grid_dependency", "launched_programmatically",
           "RELEASE_SHARE", "ISSUE_PER_SM_CYCLE", "issue_slots_per_byte", "issue_share_needed"]

WARPS = (1, 2, 4, 8, 16, 32)  # the warp counts a Triton launch takes
DECODE_TOKENS = 128  # at most this many tokens: a decode step, whose time is the launch chain, not its bytes
_VECTOR_BYTES = 16  # the widest load a thread issues in one instruction
_MIN_PROGRAMS_PER_SM = 2  # fewer leaves SMs idle while others work
# A grid that fills at most this share of the GPU's warp slots releases the grid after it once its own wait is over
# (docs/tuning.md#grid-dependency)
RELEASE_SHARE = 0.25
# Bytes of a fused q+k tile one thread holds at most (three 16-byte vectors): beyond it, more warps share the tile.
# The H100 measured the bound (docs/tuning.md#launch-table): at 16 warps 40 bytes a thread ran as fast as any tile,
# 64 bytes ran slower than the same tile at 32 warps.
THREAD_BYTES = 48


@dataclass(frozen=True)
class DeviceFacts:
    """What the model knows about a GPU: its published limits, its copy bandwidth and its loaded memory latency.

    The first five fields keep the order of the course's ``DeviceModel`` (which is this class), so
    ``DeviceFacts(name, n_sms, ceiling_gbps, latency_ns, latency_source)`` describes a GPU by its SMs and bus alone.
    """

    name: str
    n_sms: int
    ceiling_gbps: float  # the copy bandwidth: bytes read + written a second, in GB/s
    latency_ns: float  # the loaded memory latency
    latency_source: str  # "fitted ..." or "assumed ..."
    max_warps_per_sm: int = 64  # 2048 threads (H100, H200, A100)
    max_programs_per_sm: int = 32  # thread blocks resident on one SM at most
    registers_per_sm: int = 65536
    l2_bytes: int = 50 * 2**20  # H100 / H200
    capability: tuple[int, int] = (9, 0)
    bandwidth_source: str = "assumed"  # "measured ..." when a device copy timed it
    memory_bytes: int = 0  # the device's memory (part of the autotune cache's key)
    shared_bytes_per_program: int = 227 * 1024  # shared memory one program may hold (opt-in): Hopper's 227 KiB
    # whether the library launches this GPU's kernels programmatically where its capability allows (False with
    # ROPEKIT_PDL=0 and on ROCm builds: ropekit.triton.choice.device_facts)
    programmatic_launch: bool = True

    @property
    def needed_bytes_in_flight_per_sm(self) -> float:
        """Little's law, per SM: (ceiling / SMs) x latency; GB/s x ns = bytes."""
        return self.ceiling_gbps / self.n_sms * self.latency_ns


@dataclass(frozen=True)
class Launch:
    """One kernel launch, as the model sees it."""

    programs: int  # the grid's size
    num_warps: int  # warps per program
    bytes_in_flight_per_program: int  # DRAM bytes a program requests before it waits on any of them
    registers_per_thread: int | None = None  # from the compiled kernel (n_regs), when known
    read_bytes: int | None = None  # what the whole launch reads (None: programs x bytes in flight per program)

    @property
    def bytes_read(self) -> int:
        return self.read_bytes if self.read_bytes is not None else self.programs * self.bytes_in_flight_per_program


def launched_programmatically(facts: DeviceFacts) -> bool:
    """Whether the library launches its kernels on this GPU programmatically: from compute capability 9.0, unless
    the facts say it launches plainly (``ROPEKIT_PDL=0``, a ROCm build)."""
    return facts.programmatic_launch and facts.capability >= (9, 0)


def grid_dependency(facts: DeviceFacts, programs: int, num_warps: int) -> int:
    """How a launch of ``programs`` programs of ``num_warps`` warps follows the grid before it
    (:class:`~ropekit.triton.groups.Dependency`).

    From compute capability 9.0 every launch WAITs: it may be launched before the grid ahead of it has finished, and
    its programs wait for that grid's end, which shortens a launch whatever the grid's size. A grid that fills at
    most :data:`RELEASE_SHARE` of the warp slots (a decode step) also RELEASEs the grid after it, once its own wait is
    over, which hides that grid's launch behind its own; a larger grid does not: a release cost time that grew with
    the grid's waves, and at half a wave it bought nothing (the measurements: docs/tuning.md#grid-dependency)."""
    if not launched_programmatically(facts):
        return Dependency.NONE
    if programs * num_warps <= facts.n_sms * facts.max_warps_per_sm * RELEASE_SHARE:
        return Dependency.RELEASE
    return Dependency.WAIT


# A warp's registers are allocated in blocks of 256 (compute capability 7.0 to 9.0): a thread's count rounds up to a
# multiple of 8, as the GPU (and ncu's theoretical occupancy) counts it
REGISTER_UNIT = 8


def resident_programs(launch: Launch, device: DeviceFacts) -> int:
    """Programs one SM holds at once: the smallest of its program slots, warp slots and registers allow (a thread's
    registers rounded up to :data:`REGISTER_UNIT`)."""
    limits = [device.max_programs_per_sm, device.max_warps_per_sm // launch.num_warps]
    if launch.registers_per_thread:
        registers = -(-launch.registers_per_thread // REGISTER_UNIT) * REGISTER_UNIT
        limits.append(device.registers_per_sm // (registers * 32 * launch.num_warps))
    return max(1, min(limits))


def bytes_in_flight_per_sm(launch: Launch, device: DeviceFacts) -> float:
    """Resident programs (fewer when the grid does not fill every SM) x each program's bytes in flight."""
    per_sm = min(resident_programs(launch, device), math.ceil(launch.programs / device.n_sms))
    return per_sm * launch.bytes_in_flight_per_program


def predicted_pct(launch: Launch, device: DeviceFacts) -> float:
    """The model's % of the copy ceiling: min(100, 100 x bytes in flight per SM / what Little's law asks)."""
    return 100.0 * min(1.0, bytes_in_flight_per_sm(launch, device) / device.needed_bytes_in_flight_per_sm)


# Thread instructions an SM issues a cycle at most: four schedulers, one warp instruction each (Volta to Hopper)
ISSUE_PER_SM_CYCLE = 4 * 32


def issue_slots_per_byte(facts: DeviceFacts, sm_clock_ghz: float) -> float:
    """Thread instructions an SM can issue for each byte it moves at the copy ceiling: :data:`ISSUE_PER_SM_CYCLE` over
    the bytes an SM moves a cycle, ``ceiling / SMs / clock`` (GB/s over GHz: bytes a cycle)."""
    return ISSUE_PER_SM_CYCLE / (facts.ceiling_gbps / facts.n_sms / sm_clock_ghz)


def issue_share_needed(facts: DeviceFacts, sm_clock_ghz: float, instructions_per_byte: float) -> float:
    """The share of an SM's issue slots a kernel that issues ``instructions_per_byte`` thread instructions for each
    byte it moves must keep busy to move its bytes at the copy ceiling (above 1: it cannot)."""
    return instructions_per_byte / issue_slots_per_byte(facts, sm_clock_ghz)


def fit_latency_ns(points: list[tuple[float, float]], n_sms: int, ceiling_gbps: float,
                   below: float = 0.7) -> float | None:
    """The latency that Little's law gives for measured ``(bytes in flight per SM, GB/s)`` points: for each point
    below ``below`` x the ceiling (where the bytes in flight, not the bus, limit), latency = bytes in flight on the
    device / bandwidth; the median over those points. None when no point is latency-bound."""
    estimates = [per_sm * n_sms / gbps for per_sm, gbps in points if 0 < gbps < below * ceiling_gbps]
    return statistics.median(estimates) if estimates else None


def register_budget(facts: DeviceFacts) -> int:
    """32-bit registers a thread may hold while the SM keeps every warp slot filled (32 on the H100: 65536 / 2048).
    The model lets a thread hold that many tile values (the kernels compute in float32)."""
    return max(8, facts.registers_per_sm // (32 * facts.max_warps_per_sm))


def tile_values_max(facts: DeviceFacts) -> int:
    """The most tile values one program may hold: the register budget at the largest warp count (32768 on the H100:
    32 values x 32 threads x 32 warps). A larger tile would spill."""
    return register_budget(facts) * 32 * WARPS[-1]


def _moved_bytes(shape: RopeShape | FusedShape) -> int:
    """q's and k's bytes, read and written (a fused call's: a lower bound, its widest vector times its most heads)."""
    if isinstance(shape, FusedShape):
        return 2 * shape.n_tokens * shape.n_heads * shape.width * shape.element_size
    return 2 * shape.n_tokens * (shape.n_heads_q + shape.n_heads_k) * shape.head_dim * shape.element_size


def fits_in_l2(facts: DeviceFacts, shape: RopeShape | FusedShape) -> bool:
    """Whether the call's bytes (q and k, read and written) fit in the L2 cache: then the L2 serves it."""
    return _moved_bytes(shape) <= facts.l2_bytes


def _fused_qk_values(shape: RopeShape, block_s: int, block_h: int = 1) -> int:
    """Values a fused q+k tile of ``block_s`` tokens holds: q's tile of ``block_h`` heads (at least q's head count)
    beside k's (heads and channels padded to powers of two)."""
    heads = max(block_h, next_pow2(shape.n_heads_q)) + (next_pow2(shape.n_heads_k) if shape.n_heads_k else 0)
    return block_s * heads * next_pow2(shape.head_dim)


def _fewest_warps(tile_bytes: int, least: int = 4) -> int:
    """The fewest warps (at least ``least``) at which a thread holds at most :data:`THREAD_BYTES` of the tile."""
    for warps in WARPS:
        if warps >= least and tile_bytes <= THREAD_BYTES * 32 * warps:
            return warps
    return WARPS[-1]


def _tile_programs(shape: RopeShape, block_s: int, block_h: int) -> int:
    heads = cdiv(shape.n_heads_q, block_h) + (cdiv(shape.n_heads_k, block_h) if shape.n_heads_k else 0)
    return cdiv(shape.n_tokens, block_s) * heads


def flat_bytes_in_flight_per_sm(facts: DeviceFacts, shape: RopeShape, config: FlatConfig) -> int:
    """What an SM's resident flat programs (its warp and program slots allow) keep in flight: each loads its head
    vectors (:func:`~ropekit.triton.configs.flat_rows`; paired: of q and of k) before it waits on any of them.
    Registers are not counted (Triton 3.6 compiles the flat kernel to at most 32 a thread for sm_90: full residency),
    nor the cos/sin loads (cache hits)."""
    resident = min(facts.max_programs_per_sm, facts.max_warps_per_sm // config.num_warps)
    program = flat_rows(config.block, shape.head_dim) * shape.head_dim
    return resident * program * shape.element_size * (2 if config.paired else 1)


def flat_meets_littles_law(facts: DeviceFacts, shape: RopeShape) -> bool:
    """Whether the model's flat block keeps what Little's law asks in flight on every SM. Where it does, every
    flat candidate does too, and the model's choice stands untimed; where even its block of 8 vectors a thread falls
    short, the autotune decides (:mod:`ropekit.triton.choice`)."""
    config = _flat_config(facts, shape)
    return flat_bytes_in_flight_per_sm(facts, shape, config) >= facts.needed_bytes_in_flight_per_sm


def _flat_config(facts: DeviceFacts, shape: RopeShape, num_warps: int = 4, paired: bool = False) -> FlatConfig:
    """One 16-byte vector a thread a stream (paired: half a vector of q and half of k), doubled while the SM's
    resident programs would keep fewer bytes in flight than Little's law asks, up to 8 vectors a thread.

    4 warps a program: at one vector a thread, 16 programs of 4 warps keep the bytes in flight of 8 programs of 8,
    and graph replay measured them faster on the H200 and level on the H100; an SM refills a program's slots only
    when its last warp ends, so the smaller program leaves fewer warp slots idle while its warps finish unevenly
    (docs/tuning.md#flat-path)."""
    vector = _VECTOR_BYTES // shape.element_size or 1
    config = FlatConfig(block=32 * num_warps * vector // (2 if paired else 1), num_warps=num_warps, paired=paired)
    while flat_bytes_in_flight_per_sm(facts, shape, config) < facts.needed_bytes_in_flight_per_sm \
            and config.block < 8 * 32 * num_warps * vector:
        config = config._replace(block=config.block * 2)
    return config


def tile_bytes_in_flight_per_sm(facts: DeviceFacts, shape: RopeShape, config: TileConfig) -> int:
    """What an SM's resident tile programs keep in flight (:func:`bytes_in_flight_per_sm` of the tile's launch): each
    loads its head vectors (``block_s x block_h``, the rotary channels and the tail alike) before it waits on any of
    them. Registers are not counted (a small tile is far inside a thread's budget), nor the cos/sin rows (cache
    hits)."""
    tile_bytes = config.block_s * config.block_h * shape.head_dim * shape.element_size
    programs = _tile_programs(shape, config.block_s, config.block_h)
    return bytes_in_flight_per_sm(Launch(programs, config.num_warps, tile_bytes), facts)


def streaming_tile(facts: DeviceFacts, shape: RopeShape) -> TileConfig:
    """The tile of a call larger than the L2, which streams q and k from DRAM.

    4 warps, and as many head vectors of one token as make one 16-byte vector a thread (2 KiB a program: 8 heads of
    128 16-bit channels; more tokens where a token's heads hold less), doubled, heads first, while the SM's resident
    programs would keep fewer bytes in flight than Little's law asks, up to 8 vectors a thread; at most 32 heads and
    16 tokens a program. The streaming hint: q and k are read once and should not push the table rows, which every
    head reuses, out of the L2. The tile kernel's grid runs the head blocks of a token side by side, so the programs
    resident at any moment read one stretch of memory. Small programs also leave fewer warp slots idle while a
    program's last warps finish (docs/tuning.md#launch-table). A head wider than 8 vectors a thread takes the fused
    q+k tile's rule instead, which gives wide tiles more warps."""
    num_warps = 4
    head_bytes = next_pow2(shape.head_dim) * shape.element_size
    heads = min(next_pow2(max(shape.n_heads_q, shape.n_heads_k)), _TILE_HEADS[-1])
    program_bytes = _VECTOR_BYTES * 32 * num_warps
    if head_bytes > 8 * program_bytes:
        return _fused_qk_tile(facts, shape)
    block_h = max(1, min(heads, program_bytes // head_bytes))
    block_s = max(1, min(_TILE_TOKENS[-1], program_bytes // (block_h * head_bytes)))
    config = TileConfig(block_s, block_h, num_warps, evict_first=True, heads_inner=True)
    while tile_bytes_in_flight_per_sm(facts, shape, config) < facts.needed_bytes_in_flight_per_sm \
            and config.block_s * config.block_h * head_bytes < 8 * program_bytes:
        if config.block_h < heads:
            config = config._replace(block_h=config.block_h * 2)
        elif config.block_s < _TILE_TOKENS[-1]:
            config = config._replace(block_s=config.block_s * 2)
        else:
            break
    return config


def model_rope(facts: DeviceFacts, shape: RopeShape) -> TileConfig | FlatConfig:
    """The model's configuration for a RoPE launch (docs/tuning.md#how-the-library-chooses).

    * Larger than the L2 (DRAM-bound):
      - the flat kernel where the call allows it (``shape.flat_ok``), 4 warps, one 16-byte vector a thread (a head
        whose halves are not powers of two pads them, and its block holds fewer bytes: :func:`_flat_config` doubles
        it while Little's law asks for more);
      - else, for a rotation over the whole head of a batch of equal sequences with cos/sin read at one position a
        token (a table or per-token rows), a small tile (:func:`streaming_tile`);
      - else a fused q+k tile (:func:`_fused_qk_tile`). A partial rotation's small tile loads narrow vectors and,
        in place, half the bytes a program; a packed batch's grid covers its longest sequence for every sequence,
        and the programs past a shorter one's end return at once: a one-token tile makes as many of them as tokens.
        Angles computed in the kernel (or M-RoPE's position a pair) are work a program's heads share: a tile of
        every head does it once a token. The small tile was not measured on those.
    * L2-resident: a tile of 4 warps, 2 tokens (1 with per-token cos/sin rows, whose rows no token shares) x as
      many heads as a thread's register budget allows; then tokens, then heads, halved while the grid would give
      an SM fewer than two programs.
    """
    if not fits_in_l2(facts, shape):
        if shape.flat_ok:
            return _flat_config(facts, shape)
        if shape.rotary_dim == shape.head_dim and not shape.varlen and not shape.computed_angles:
            return streaming_tile(facts, shape)
        return _fused_qk_tile(facts, shape)
    num_warps = 4
    block_s = 1 if shape.cos_per_token else 2
    heads = next_pow2(max(shape.n_heads_q, shape.n_heads_k))
    per_thread = register_budget(facts) * 32 * num_warps
    block_h = max(1, min(heads, _TILE_HEADS[-1], per_thread // (block_s * next_pow2(shape.head_dim))))
    block_h = 1 << (block_h.bit_length() - 1)
    target = _MIN_PROGRAMS_PER_SM * facts.n_sms
    while _tile_programs(shape, block_s, block_h) < target and (block_s > 1 or block_h > 1):
        if block_s > 1:
            block_s //= 2
        else:
            block_h //= 2
    return TileConfig(block_s, block_h, num_warps)


def model_fused(facts: DeviceFacts, shape: FusedShape, registers=None) -> FusedConfig:
    """The model's configuration for a fused launch (docs/tuning.md#how-the-library-chooses).

    * A decode step (at most :data:`DECODE_TOKENS` tokens) is bound by its launch chain, not its bytes: one token a
      program, 4 warps, no hint. Launched programmatically (:func:`launched_programmatically`), a grid's programs
      are placed while the grid ahead still runs, and the step is what they do after their wait (a position, a
      table row, the tile, the store): every head of a token (up to 32) in one program, the fewest programs, each
      loading its token's position and table row once. On the H200 at 64 tokens that beat fewer heads a program on
      every decode format (docs/tuning.md#fused-launch-table). It is taken for head vectors of at most 128 channels
      where a program a token's q heads and one its k heads still give at least half the SMs a program. Where the
      cache's scales are reduced (per (token, head), NVFP4's per 16 channels), v's heads then get programs of their
      own (``v_apart``): a k program would otherwise reduce and store v's vectors after k's, on the step's longest
      chain, while v's own programs wait for no position and no table row; a store that reduces nothing costs a k
      program less than the extra programs cost the step (docs/tuning.md#fused-launch-table). Otherwise,
      and launched plainly, the programs' placement is part of the chain: 8 heads a program (4 with a float8 cache,
      whose rounding is the program's cost; 32 for vectors wider than 128 channels, MLA's latent), then heads halved
      while the grid (q and k programs) would give an SM fewer than two programs.
    * A prefill streams from DRAM: the streaming hint, and each token block's q and k programs launched side by side
      (the k programs' arithmetic under the q programs' traffic); 2 tokens x 8 heads, 4 tokens with QK-norm (its
      reduction amortised over more rows; 32 values a thread at 4 warps); wider vectors: 8 warps, no hint. A store
      with per-head arithmetic (scales computed per (token, head) or per 16 channels, or q quantised:
      :attr:`FusedShape.heavy_store`) takes 16 heads a program: half the programs, each table row loaded once for
      twice the heads. Where only the cache's scales are reduced (no QK-norm, q stored in its dtype), the k programs
      are the heavy ones: a scale per (token, head) then gives v's heads programs of their own (``v_apart``), since a
      k program that also reduced v's would hold both tiles, and the kernel's registers are its heaviest program's,
      so every program would hold k's and v's (with a norm or a float8 q the q programs are as heavy, and v apart
      measured slower). NVFP4's k programs keep v's, at 32 heads a program: a token block's q programs (a plain
      rotation) are then as few as its k programs, whose instructions bound the store. Past the L2, where the
      compiled kernel's registers are known (``registers(config)``: a thread's registers, or None), the heads a
      program double while the programs an SM holds keep less of q's tile in flight than Little's law asks
      (:func:`fused_bytes_in_flight_per_sm`).
    * The backward: 1 token a step, as many heads as give each thread 16 bytes of each half of a head vector (one
      copy of the widest kind: 16 heads of 128 bf16 channels at 4 warps), 16 token blocks a program walked four
      stages deep, the weight-gradient terms summed in registers (:func:`_backward_rule`).

    Heads a program never exceed the call's (rounded up to a power of two), and a program's tile stays within the
    register bound (at most 32768 values: fewer heads, then fewer tokens, for very wide vectors).

    A norm over all heads of a token (``norm_over_heads``) needs every head of the token in one program: the heads
    are the call's (rounded up), one token a program at up to 32 values a thread, in as many warps as share them;
    vectors wider than 128 channels keep the rule's tokens within the bound at the rule's values a thread
    (:func:`_all_heads`).
    """
    config = _fused_rule(facts, shape)
    if shape.norm_over_heads:
        config = _all_heads(config, shape)
    else:
        while config.block_s * config.block_h * next_pow2(shape.width) > _TILE_VALUES_LIMIT and config.block_h > 1:
            config = config._replace(block_h=config.block_h // 2)  # very wide vectors: within the register bound
        while config.block_s * config.block_h * next_pow2(shape.width) > _TILE_VALUES_LIMIT and config.block_s > 1:
            config = config._replace(block_s=config.block_s // 2)
        if registers is not None and prefill_past_l2(facts, shape):
            config = _enough_in_flight(facts, shape, config, registers)
    return _within_shared_memory(facts, config, shape)


def prefill_past_l2(facts: DeviceFacts, shape: FusedShape) -> bool:
    """A forward launch of more tokens than a decode step whose bytes exceed the L2: it streams from DRAM, where what
    a program keeps in flight decides its speed."""
    return not shape.backward and shape.n_tokens > DECODE_TOKENS and not fits_in_l2(facts, shape)


# Dependent memory round trips a forward program waits through: its position (or its sequence's offset), then its
# table row; its tile's loads, issued at its start, return within the first.
_ROUND_TRIPS = 2


def fused_bytes_in_flight_per_sm(facts: DeviceFacts, shape: FusedShape, config: FusedConfig,
                                 registers_per_thread: int) -> float:
    """What an SM's resident programs of a forward launch keep in flight on average: each loads its tile of q
    (``block_s x block_h`` head vectors, the least a program loads: a k program loads v's tile too, or with v apart
    k's alone, as a v program v's) at its start, and holds its slot for :data:`_ROUND_TRIPS` dependent round trips
    (its position, then its table row), so over its life it keeps half its tile in flight; an SM holds as many
    programs as the compiled kernel's registers, the warp slots and the program slots allow
    (:func:`resident_programs`)."""
    tile_bytes = config.block_s * config.block_h * shape.rotated_width * shape.element_size
    programs = cdiv(shape.n_tokens, config.block_s) * cdiv(shape.n_heads, config.block_h)
    launch = Launch(programs, config.num_warps, tile_bytes, registers_per_thread)
    return bytes_in_flight_per_sm(launch, facts) / _ROUND_TRIPS


def _keeps_enough(facts: DeviceFacts, shape: FusedShape, config: FusedConfig, registers) -> bool | None:
    """Whether ``config``'s resident programs keep what Little's law asks in flight; None where its registers are
    not known."""
    count = registers(config)
    return None if not count else fused_bytes_in_flight_per_sm(facts, shape, config, count) \
        >= facts.needed_bytes_in_flight_per_sm


def _enough_in_flight(facts: DeviceFacts, shape: FusedShape, config: FusedConfig, registers) -> FusedConfig:
    """The rule's tile, with twice the heads while its resident programs keep less in flight than Little's law asks
    (:func:`fused_bytes_in_flight_per_sm`: a GPU with more bandwidth an SM asks more; a kernel holding more registers
    a thread leaves an SM fewer programs), within the call's heads, the candidate space's and the register bound."""
    heads = min(next_pow2(shape.n_heads), _FUSED_HEADS[-1])
    while config.block_h < heads and config.block_s * config.block_h * 2 * next_pow2(shape.width) <= _TILE_VALUES_LIMIT:
        if _keeps_enough(facts, shape, config, registers) is not False:
            break
        config = config._replace(block_h=config.block_h * 2)
    return config


def fused_meets_littles_law(facts: DeviceFacts, shape: FusedShape, registers) -> bool:
    """Whether the model's tile for a forward prefill past the L2 keeps what Little's law asks in flight, counted from
    the compiled kernel's registers (``registers(config)``, as :func:`model_fused` takes it). Where it does, the
    model's choice stands untimed; where the call's heads or the register bound stopped its doubling short, or the
    registers are not known, the autotune decides (:mod:`ropekit.triton.choice`)."""
    return bool(_keeps_enough(facts, shape, model_fused(facts, shape, registers), registers))


# What the backward keeps in shared memory besides its pipeline (its cos/sin rows and reductions: about 1 KiB for 128
# channels), with room to spare
_SHARED_RESERVED = 8 * 1024
# The pipeline's bound on Hopper (227 KiB a program): the candidate space's, whatever the GPU
_SHARED_BYTES = 227 * 1024 - _SHARED_RESERVED


def _pipeline_bytes(config: FusedConfig, shape: FusedShape) -> int:
    """Shared memory the backward's software pipeline takes: ``stages - 1`` token blocks in flight of the two
    tensors it walks (the forward's input and the incoming gradient), in their element size."""
    tile = config.block_s * config.block_h * next_pow2(shape.width) * shape.element_size
    return (config.stages - 1) * 2 * tile


def _within_shared_memory(facts: DeviceFacts, config: FusedConfig, shape: FusedShape) -> FusedConfig:
    """Fewer pipeline stages while the backward's walk would need more shared memory than a program has on this GPU
    (:attr:`DeviceFacts.shared_bytes_per_program`; a norm over 128 heads of 128 float32 channels takes 64 KiB a tensor
    a stage)."""
    limit = min(facts.shared_bytes_per_program - _SHARED_RESERVED, _SHARED_BYTES)
    while config.stages > 1 and _pipeline_bytes(config, shape) > limit:
        config = config._replace(stages=config.stages - 1)
    return config


# Values a thread, at most, of a program that holds every head of its token (a norm over all heads), one token a
# program: the norm's two reductions a token (the mean square, and in the backward the gradient's dot product) span
# the program, and each crosses its warps through shared memory behind a barrier, so fewer warps of more values wait
# less a token. A forward prefill measured fastest at 4 warps for 32 heads of 128 channels on the H100 and the H200,
# and a decode step and the backward at the same on the H200 (docs/tuning.md#fused-launch-table). Fewer heads keep the
# rule's 4 warps and fewer values a thread
_ALL_HEADS_VALUES = 32


def _all_heads(config: FusedConfig, shape: FusedShape) -> FusedConfig:
    """The rule's configuration with every head of a token in one program (the norm's reduction runs over them): one
    token a program at :data:`_ALL_HEADS_VALUES` a thread at most, in the warps that share them (at least the rule's
    4). More tokens a program amortise nothing more, since the reduction already spans every head of a token, and a
    program of one token compiles to fewer registers a thread, so more programs fit an SM. Vectors wider than 128
    channels keep the rule's tokens while the tile passes the register bound, at the rule's own values a thread (at
    least 8: a 16-byte vector of bf16), up to 32 warps."""
    heads, width = next_pow2(shape.n_heads), next_pow2(shape.width)
    if shape.width > 128:
        density = max(config.block_s * config.block_h * width // (32 * config.num_warps), 8)
        block_s = config.block_s
    else:
        density, block_s = _ALL_HEADS_VALUES, 1
    while block_s > 1 and block_s * heads * width > _TILE_VALUES_LIMIT:
        block_s //= 2
    warps = next_pow2(cdiv(block_s * heads * width, 32 * density))
    return config._replace(block_s=block_s, block_h=heads, num_warps=min(max(warps, config.num_warps), WARPS[-1]))


# The backward's copies: a thread's share of each half of a head vector, in bytes, for which the compiler issues one
# copy of the widest kind (16 bytes: cp.async.cg, LDGSTS.E.BYPASS.128 in the sm_90 SASS). A step of fewer heads
# spreads the halves thinner (8 heads of 128 bf16 channels at 4 warps: 8 bytes a copy), so each copy and each store
# moves fewer bytes
_BACKWARD_COPY_BYTES = 16
# Pipeline stages of the backward's walk. A program of wide copies holds about 125 registers a thread (1 x 16 heads
# of 128 channels; every head of OLMo-2's 32, over 200), so an SM holds two to four of them. A token's reductions
# and the pipeline's own barriers stop a program's warps; what stays in flight meanwhile is what the few programs'
# pipelines issued before, and a fourth stage issues one more token's copies ahead (docs/tuning.md#fused-launch-table)
_BACKWARD_STAGES = 4


def _backward_rule(shape: FusedShape) -> FusedConfig:
    """The backward: one token a step, as many heads (up to the call's) as give each of 4 warps' threads
    :data:`_BACKWARD_COPY_BYTES` of each half of a head vector, 16 token blocks a program walked
    :data:`_BACKWARD_STAGES` deep, the streaming hint and the heads-inner order."""
    warps = 4
    block_h = max(1, 32 * warps * 2 * _BACKWARD_COPY_BYTES // (next_pow2(shape.width) * shape.element_size))
    return FusedConfig(1, min(next_pow2(shape.n_heads), block_h), warps, evict_first=True, heads_inner=True,
                       token_blocks=16, stages=_BACKWARD_STAGES)


def _fused_rule(facts: DeviceFacts, shape: FusedShape) -> FusedConfig:
    heads = next_pow2(shape.n_heads)
    if shape.backward:
        return _backward_rule(shape)
    if shape.n_tokens <= DECODE_TOKENS:
        def programs(block_h):  # q's and k's, one token a program
            return 2 * shape.n_tokens * cdiv(shape.n_heads, block_h)
        every_head = min(heads, 32)
        if launched_programmatically(facts) and shape.width <= 128 and 2 * programs(every_head) >= facts.n_sms:
            return FusedConfig(1, every_head, 4, v_apart=shape.reduces_scales)
        block_h = min(heads, 32 if shape.width > 128 else 4 if shape.quantised_cache else 8)
        while block_h > 1 and programs(block_h) < _MIN_PROGRAMS_PER_SM * facts.n_sms:
            block_h //= 2
        return FusedConfig(1, block_h, 4)
    if shape.rotated_width > 128:
        return FusedConfig(2, min(heads, 8), 8)
    block_h = 16 if shape.heavy_store else 8
    v_apart = False
    if shape.reduces_scales and not shape.q_format and not shape.norm:  # the k programs are the heavy ones
        if shape.per_token_head_scales:
            v_apart = True  # a k program reducing v's too would set every program's registers
        else:
            block_h = 32  # NVFP4: its q programs as few as its k programs, whose instructions bound the store
    return FusedConfig(4 if shape.norm and not shape.quantised_cache else 2, min(heads, block_h), 4, evict_first=True,
                       heads_inner=True, v_apart=v_apart)


# --------------------------------------------------------------------------------------------------------------------
# Candidates: the model's choice and a few neighbours, every one a configuration the kernels accept.
# --------------------------------------------------------------------------------------------------------------------

_TILE_TOKENS = (1, 2, 4, 8, 16)
_TILE_HEADS = (1, 2, 4, 8, 16, 32)
_FUSED_QK_TOKENS = (1, 2, 4)
_FLAT_WARPS = (4, 8, 16)
_FUSED_TOKENS = (1, 2, 4, 8)
_FUSED_HEADS = (1, 2, 4, 8, 16, 32, 64)


def is_valid_rope(config: TileConfig | FlatConfig, shape: RopeShape) -> bool:
    """Whether the kernels accept ``config`` for ``shape`` and it stays within the register bound: power-of-two
    blocks, warps in :data:`WARPS`, a flat block a multiple of 32 x warps (flat only where ``shape.flat_ok``, paired
    only where k has q's shape), a tile of at most 32768 values (the H100's :func:`tile_values_max`)."""
    if config.num_warps not in WARPS:
        return False
    if isinstance(config, FlatConfig):
        return (shape.flat_ok and config.block == next_pow2(config.block) and config.block % (32 * config.num_warps) == 0
                and (not config.paired or (shape.same_shape and shape.n_heads_k > 0)))
    if config.block_s != next_pow2(config.block_s) or config.block_h != next_pow2(config.block_h):
        return False
    if config.fused_qk:
        return (config.block_h >= next_pow2(shape.n_heads_q)
                and _fused_qk_values(shape, config.block_s, config.block_h) <= _TILE_VALUES_LIMIT)
    return config.block_s * config.block_h * next_pow2(shape.head_dim) <= _TILE_VALUES_LIMIT


def is_valid_fused(config: FusedConfig, shape: FusedShape) -> bool:
    """Whether the fused kernels accept ``config`` for ``shape``: power-of-two blocks, warps in :data:`WARPS`, a
    program's tile within the register bound, the backward's pipeline within shared memory; walking several token
    blocks only in the backward."""
    if config.num_warps not in WARPS or config.token_blocks < 1 or config.stages < 1:
        return False
    if any(n != next_pow2(n) for n in (config.block_s, config.block_h)):
        return False
    if not shape.backward and (config.token_blocks, config.stages) != (1, 1):
        return False
    if shape.backward and config.v_apart:
        return False
    if _pipeline_bytes(config, shape) > _SHARED_BYTES:
        return False
    values = config.block_s * config.block_h * next_pow2(shape.width)
    if shape.norm_over_heads:  # every head of a token in one program, one token even past the bound
        return config.block_h == next_pow2(shape.n_heads) and (config.block_s == 1 or values <= _TILE_VALUES_LIMIT)
    return values <= _TILE_VALUES_LIMIT


_TILE_VALUES_LIMIT = 32768  # the H100's tile_values_max: the kernels' register bound on any GPU


def rope_candidate_space(shape: RopeShape) -> list[TileConfig | FlatConfig]:
    """Every configuration the model and the autotune can reach for ``shape``, whatever the GPU: tiles of
    1-16 tokens x 1-32 heads (2-8 warps, with and without the hint, in either launch order), fused q+k tiles of 1-4
    tokens (4-32 warps), and where the call allows the flat kernel, its blocks of one vector a thread at 4-16 warps
    (paired where k has q's shape, with and without the hint). For compute-sanitizer runs over the whole space."""
    heads = next_pow2(max(shape.n_heads_q, shape.n_heads_k))
    space: list = []
    for block_s in _TILE_TOKENS:
        for block_h in (h for h in _TILE_HEADS if h <= max(heads, 1)):
            for num_warps in (2, 4, 8):
                for evict in (False, True):
                    for heads_inner in (False, True):
                        space.append(TileConfig(block_s, block_h, num_warps, evict_first=evict,
                                                heads_inner=heads_inner))
    for block_s in _FUSED_QK_TOKENS:
        for num_warps in (4, 8, 16, 32):
            for evict in (False, True):
                space.append(TileConfig(block_s, next_pow2(shape.n_heads_q), num_warps, fused_qk=True,
                                        evict_first=evict))
    if shape.flat_ok:
        vector = _VECTOR_BYTES // shape.element_size or 1
        for num_warps in _FLAT_WARPS:
            for paired in (False, True):
                for scale in (1, 2, 4, 8):
                    block = 32 * num_warps * vector * scale // (2 if paired else 1)
                    for streaming in (False, True):
                        space.append(FlatConfig(block, num_warps, paired=paired, streaming=streaming))
    return [c for c in dict.fromkeys(space) if is_valid_rope(c, shape)]


def fused_candidate_space(shape: FusedShape) -> list[FusedConfig]:
    """Every configuration the model and the autotune can reach for a fused ``shape``: 1-8 tokens x 1-64 heads
    (capped at the call's), 2-8 warps, with and without the hint and the heads-inner order; for the backward, one
    token block a program, or 8 or 16 at 1-4 stages (fewer where shared memory bounds the pipeline). A norm over all
    heads: the call's heads (rounded up) in every program, 2-32 warps. Where the cache's scales are reduced, each
    of the forward's also with v's programs apart."""
    heads = next_pow2(shape.n_heads)
    walks = ((1, 1),) + tuple((blocks, stages) for blocks in (8, 16) for stages in (4, 3, 2, 1)) if shape.backward \
        else ((1, 1),)
    # (a norm over all heads: every head of a token in a program, and the warps a large tile takes)
    head_blocks = (heads,) if shape.norm_over_heads else [h for h in _FUSED_HEADS if h <= heads]
    warps = WARPS[1:] if shape.norm_over_heads else (2, 4, 8)
    # (v's own programs: the model's choice at decode where the cache's scales are reduced, and at a prefill with a
    # scale per (token, head), no norm and q in its dtype; valid at any size)
    apart = (False, True) if shape.reduces_scales and not shape.backward else (False,)
    space = [FusedConfig(block_s, block_h, num_warps, evict, inner, blocks, stages, v_apart)
             for block_s in _FUSED_TOKENS for block_h in head_blocks
             for num_warps in warps for evict in (False, True) for inner in (False, True)
             for blocks, stages in walks for v_apart in apart]
    return [c for c in space if is_valid_fused(c, shape)]


def _keep(candidates: list, space: list, limit: int = 8) -> list:
    allowed = set(space)
    return [c for c in dict.fromkeys(candidates) if c in allowed][:limit]


def rope_candidates(facts: DeviceFacts, shape: RopeShape) -> list[TileConfig | FlatConfig]:
    """At most 8 configurations for the autotune, the model's choice first: its neighbours (half and twice the
    tokens, heads, warps or block), the other kernels where they may run (a flat call also tries the streaming tile,
    a streaming tile the fused q+k tile), and the pairing and warp choices the H100 measured best. Each is in
    :func:`rope_candidate_space`."""
    chosen = model_rope(facts, shape)
    out = [chosen]
    if isinstance(chosen, FlatConfig):
        out += [_flat_config(facts, shape, num_warps=8, paired=True) if shape.same_shape else None,
                _flat_config(facts, shape, num_warps=8), _flat_config(facts, shape, num_warps=16),
                chosen._replace(block=chosen.block * 2)]
        tile = model_rope(facts, shape._replace(flat_ok=False))
        out += [tile, tile._replace(num_warps=min(32, tile.num_warps * 2))]
    elif chosen.fused_qk:
        out += [chosen._replace(num_warps=min(32, chosen.num_warps * 2)),
                chosen._replace(num_warps=max(4, chosen.num_warps // 2)),
                chosen._replace(block_s=1), chosen._replace(block_s=4),
                chosen._replace(evict_first=False), TileConfig(16, 1, 8, evict_first=True)]
    else:
        s, h, w = chosen.block_s, chosen.block_h, chosen.num_warps
        out += [chosen._replace(block_h=h * 2), chosen._replace(block_h=max(1, h // 2)),
                chosen._replace(block_s=s * 2), chosen._replace(block_s=max(1, s // 2)),
                chosen._replace(num_warps=w * 2)]
        if chosen.heads_inner:  # streaming: the launch order flipped, and the fused q+k tile
            out += [chosen._replace(heads_inner=False), _fused_qk_tile(facts, shape)]
        else:
            out += [chosen._replace(num_warps=max(2, w // 2)), chosen._replace(evict_first=not chosen.evict_first)]
    return _keep([c for c in out if c is not None], rope_candidate_space(shape))


def _fused_qk_tile(facts: DeviceFacts, shape: RopeShape) -> TileConfig:
    """A fused q+k tile: 2 tokens x every head of q and of k (cos/sin fetched once a token, every load issued before
    any store), 1 token when 2 would exceed :func:`tile_values_max`, with the fewest warps (at least 4) at which a
    thread holds at most :data:`THREAD_BYTES` of it, and the streaming hint; heads too many even for 1 token: 16
    tokens (fewer for very wide heads) x 1 head, 8 warps."""
    limit = tile_values_max(facts)
    for block_s in (2, 1):
        values = _fused_qk_values(shape, block_s)
        if values <= limit:
            return TileConfig(block_s, next_pow2(shape.n_heads_q), _fewest_warps(values * shape.element_size),
                              fused_qk=True, evict_first=True)
    block_s = 16
    while block_s > 1 and block_s * next_pow2(shape.head_dim) > limit:
        block_s //= 2
    return TileConfig(block_s, 1, 8, evict_first=True)


def fused_candidates(facts: DeviceFacts, shape: FusedShape, registers=None) -> list[FusedConfig]:
    """At most 8 configurations for the fused autotune, the model's choice first (``registers`` as
    :func:`model_fused` takes it), then its neighbours: twice and half the heads and the tokens, twice the warps, the
    hint and launch order flipped, v's programs apart or not where the cache's scales are reduced; for the backward,
    half the token blocks and no pipelining. Each is in :func:`fused_candidate_space`."""
    chosen = model_fused(facts, shape, registers)
    s, h, w = chosen.block_s, chosen.block_h, chosen.num_warps
    out = [chosen, chosen._replace(block_h=h * 2), chosen._replace(block_h=max(1, h // 2)),
           chosen._replace(block_s=s * 2), chosen._replace(block_s=max(1, s // 2)),
           chosen._replace(num_warps=w * 2)]
    if shape.backward:
        out += [chosen._replace(token_blocks=8), chosen._replace(stages=1, token_blocks=1)]
    else:
        out += [chosen._replace(evict_first=not chosen.evict_first, heads_inner=not chosen.heads_inner),
                chosen._replace(v_apart=not chosen.v_apart)]
    return _keep(out, fused_candidate_space(shape))
