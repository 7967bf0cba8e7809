"""What ``python -m ddp_engine doctor`` finds out about the GPUs before it measures: each GPU's
links (PCIe generation and width, NVLink), each pair's P2P status and PCIe topology, and the
warnings a user should act on before a long run, each with what to do.

Every NVML call goes through :meth:`Nvml.query`, so a call a GPU or driver does not support is
None ("unknown"), never an error. NVML's enum values are ABI, fixed across drivers; they are
spelled out here because the call sites get the module only through :class:`Nvml`.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass, field

from ddp_engine.common.gpus import CLOCK_SLOWDOWNS, GpuInfo, GpuProcess, GpuReading, Nvml
from ddp_engine.common.inventory import GpuInventory, mig_advice

P2P_CAPS_INDEX_READ = 0
"""NVML_P2P_CAPS_INDEX_READ. (pynvml spells it ``(0,)``, a tuple its own nvmlDeviceGetP2PStatus
cannot pass to the C function, so the number is used.)"""
P2P_STATUS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported",
              3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}
"""NVML_P2P_STATUS_*."""
TOPOLOGY = {0: ("same board", "internal"), 10: ("PIX", "one PCIe switch"),
            20: ("PXB", "several PCIe switches"), 30: ("PHB", "the CPU's host bridge"),
            40: ("NODE", "host bridges of one CPU"), 50: ("SYS", "between CPU sockets")}
"""NVML_TOPOLOGY_* common-ancestor levels, with nvidia-smi topo's names."""
SHARED_SWITCH = (0, 10, 20)
"""Levels at which two GPUs talk without crossing the CPU: P2P should work there."""
PCIE_GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.56}
"""GB/s per lane and direction, after line encoding."""
NVLINK_GBS_PER_LINK = {1: ("1.0", 20.0), 2: ("2.0", 25.0), 3: ("2.2", 25.0), 4: ("3.0", 25.0),
                       5: ("3.1", 14.0625), 6: ("4.0", 25.0), 7: ("5.0", 50.0)}
"""nvmlDeviceGetNvLinkVersion's answer (an nvmlNvlinkVersion_t, not the version number: an
A100 answers 4) -> (version, GB/s per link and direction). 3.1 is the consumer bridge
(RTX 3090, A6000: 4 links, 56.25 GB/s per direction)."""
MAX_NVLINKS = 36
THROTTLE_REASONS = CLOCK_SLOWDOWNS
BUSY_UTIL_PCT = 10.0


@dataclass(frozen=True)
class GpuFacts:
    """One GPU: identity, a reading, and its links."""

    info: GpuInfo
    reading: GpuReading
    processes: list[GpuProcess] = field(default_factory=list)
    pcie: tuple[int | None, int | None] = (None, None)
    """Current (generation, width); the generation drops while a GPU idles."""
    pcie_max: tuple[int | None, int | None] = (None, None)
    """What GPU and slot can do together (nvmlDeviceGetMaxPcieLink*)."""
    nvlinks: list[tuple[int | None, int | None]] = field(default_factory=list)
    """Active NVLinks: (NVML index of the GPU at the other end or None for an NVSwitch,
    nvmlNvlinkVersion_t)."""
    throttle: int | None = None
    """nvmlClocksEventReason* bits, or None when NVML cannot say."""

    @property
    def pcie_allows_gbs(self) -> float | None:
        gen, width = self.pcie_max
        per_lane = PCIE_GBS_PER_LANE.get(gen or 0)
        return None if per_lane is None or not width else per_lane * width


@dataclass(frozen=True)
class PairLink:
    """How two GPUs reach each other."""

    a: int
    b: int
    p2p: int | None
    """NVML_P2P_STATUS_* of P2P reads between them; None when NVML cannot say."""
    topology: int | None
    allows_gbs: float | None
    """What the link allows per direction, GB/s (None: unknown)."""
    via: str

    @property
    def shares_switch(self) -> bool:
        return self.topology in SHARED_SWITCH

    def describe(self) -> str:
        p2p = "P2P ?" if self.p2p is None else f"P2P {P2P_STATUS.get(self.p2p, self.p2p)}"
        topo = TOPOLOGY.get(self.topology or -1)
        where = f"{topo[0]} ({topo[1]})" if topo else "topology ?"
        allows = f"link allows ~{self.allows_gbs:.1f} GB/s" if self.allows_gbs else "link ?"
        return f"GPU {self.a} - GPU {self.b}  {p2p}  {where}  {allows} ({self.via})"


def _bus_key(bus_id: str) -> tuple[int, str]:
    """A PCI bus id whatever its domain's width: 00000000:41:00.0 and 0000:41:00.0 match."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    try:
        return int(domain, 16), rest
    except ValueError:
        return -1, bus_id.lower()


def gpu_facts(nvml: Nvml, gpus: list[GpuInfo]) -> list[GpuFacts]:
    """Readings and links of ``gpus``; None (or nothing) wherever NVML cannot say."""
    by_bus = {_bus_key(g.pci_bus_id): g.index for g in gpus}
    procs = nvml.compute_processes() or []
    found = []
    for g in gpus:
        h = nvml.handle(g.index)
        q = nvml.query
        links: list[tuple[int | None, int | None]] = []
        for link in range(MAX_NVLINKS):
            state = q("nvmlDeviceGetNvLinkState", h, link)
            if state is None:  # no NVLink, or no link this high
                break
            if state:
                remote = q("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
                bus = getattr(remote, "busId", None)
                peer = by_bus.get(_bus_key(_text(bus))) if bus is not None else None
                version = q("nvmlDeviceGetNvLinkVersion", h, link)
                links.append((peer, None if version is None else int(version)))
        throttle = q("nvmlDeviceGetCurrentClocksEventReasons", h)
        if throttle is None:  # drivers before 535
            throttle = q("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        found.append(GpuFacts(
            g, nvml.read(h), [p for p in procs if p.gpu == g.index],
            (q("nvmlDeviceGetCurrPcieLinkGeneration", h), q("nvmlDeviceGetCurrPcieLinkWidth", h)),
            (q("nvmlDeviceGetMaxPcieLinkGeneration", h), q("nvmlDeviceGetMaxPcieLinkWidth", h)),
            links, None if throttle is None else int(throttle)))
    return found


def pair_links(nvml: Nvml, facts: list[GpuFacts]) -> list[PairLink]:
    """Every pair of ``facts``' GPUs: P2P status, topology, and what their link allows."""
    pairs = []
    for fa, fb in itertools.combinations(facts, 2):
        a, b = fa.info.index, fb.info.index
        ha, hb = nvml.handle(a), nvml.handle(b)
        p2p = nvml.query("nvmlDeviceGetP2PStatus", ha, hb, P2P_CAPS_INDEX_READ)
        topo = nvml.query("nvmlDeviceGetTopologyCommonAncestor", ha, hb)
        allows, via = _link_speed(fa, fb)
        pairs.append(PairLink(a, b, None if p2p is None else int(p2p),
                              None if topo is None else int(topo), allows, via))
    return pairs


def _link_speed(fa: GpuFacts, fb: GpuFacts) -> tuple[float | None, str]:
    """GB/s per direction between two GPUs: direct NVLinks, else NVLinks to an NVSwitch on
    both sides, else the slower of their PCIe links."""
    direct = [v for peer, v in fa.nvlinks if peer == fb.info.index]
    switched = [v for peer, v in fa.nvlinks if peer is None], [
        v for peer, v in fb.nvlinks if peer is None]
    for links, what in ((direct, "NVLink"), (min(switched, key=len), "NVLink via NVSwitch")):
        if links:
            known = NVLINK_GBS_PER_LINK.get(links[0] or -1)
            name = known[0] if known else f"(nvmlNvlinkVersion_t {links[0]})"
            return (None if known is None else known[1] * len(links),
                    f"{what} {name} x{len(links)}")
    speeds = [f.pcie_allows_gbs for f in (fa, fb)]
    if None in speeds:
        return None, "PCIe, speed unknown"
    slower = fa if speeds[0] <= speeds[1] else fb  # type: ignore[operator]
    gen, width = slower.pcie_max
    return slower.pcie_allows_gbs, f"PCIe gen{gen} x{width}"


def link_allows_gbs(pairs: list[PairLink]) -> float | None:
    """What the slowest link among the GPUs allows: an all-reduce's ring crosses it."""
    speeds = [p.allows_gbs for p in pairs]
    return None if not speeds or None in speeds else min(s for s in speeds if s is not None)


def warnings(facts: list[GpuFacts], pairs: list[PairLink],
             inventory: GpuInventory | None = None) -> list[str]:
    """What a user should act on before a long run on the GPUs of ``facts``, with what to do."""
    out: list[str] = []
    if inventory is not None and inventory.problem:
        out.append(f"{len(inventory.gpus)} GPU(s) found, but {inventory.problem}")
    mig = [f.info for f in facts if f.info.mig]
    if mig:
        out.append(mig_advice(mig))
    models = Counter(f.info.name for f in facts)
    if len(models) > 1:
        groups = {name: [f.info.index for f in facts if f.info.name == name] for name in models}
        largest = max(groups.values(), key=len)
        out.append("mixed GPU models: " + ", ".join(
            f"{len(ix)}x {name} (GPU {', '.join(map(str, ix))})" for name, ix in groups.items())
            + ": DDP runs every rank at the slowest GPU's pace; train on one model, e.g. "
            f"--gpus {','.join(map(str, largest))}")
    for f in facts:
        busy = _busy(f)
        if busy:
            out.append(f"{f.info.label} is busy: {busy}: a rank there runs at its pace, and "
                       "every rank waits for it; choose free GPUs with --gpus, or wait")
        for bit, (name, advice) in THROTTLE_REASONS.items():
            if f.throttle is not None and f.throttle & bit:
                out.append(f"{f.info.label} clocks are throttled ({name}): "
                           + advice.format(i=f.info.index))
        (_, width), (_, max_width) = f.pcie, f.pcie_max
        if width and max_width and width < max_width:
            out.append(f"{f.info.label} PCIe link runs at x{width} of its x{max_width}: the "
                       "slot (or a riser) has fewer lanes; move it to a x16 slot")
    for p in pairs:
        if p.shares_switch and p.p2p is not None and p.p2p != 0:
            out.append(f"P2P is disabled between GPU {p.a} and GPU {p.b} although they share "
                       f"a PCIe switch ({TOPOLOGY[p.topology or 0][0]}; NVML: "
                       f"{P2P_STATUS.get(p.p2p, p.p2p)}): PCIe ACS or the IOMMU sends their "
                       "traffic through the CPU, and NCCL crawls or hangs. Check with "
                       "nvidia-smi topo -p2p r; disable ACS (BIOS, or setpci on the switch) "
                       "and boot with iommu=pt; until then NCCL_P2P_DISABLE=1 avoids the hang")
    return out


def _busy(f: GpuFacts) -> str | None:
    """Why another job seems to be using the GPU, or None."""
    util = f.reading.util_pct
    if (util is None or util < BUSY_UTIL_PCT) and not f.processes:
        return None
    parts = [] if util is None else [f"{util:.0f}% utilization"]
    if f.reading.mem_used_bytes is not None and f.reading.mem_total_bytes:
        parts.append(f"{_gib(f.reading.mem_used_bytes)} of "
                     f"{_gib(f.reading.mem_total_bytes)} used")
    if f.processes:
        pids = ", ".join(str(p.pid) for p in f.processes)
        parts.append(f"{len(f.processes)} process{'es' if len(f.processes) > 1 else ''} "
                     f"(pid {pids})")
    return ", ".join(parts)


def describe_gpu(f: GpuFacts) -> str:
    """One line for the GPU table."""
    (gen, width), (max_gen, max_width) = f.pcie, f.pcie_max
    parts = [f.info.label, f"{_gib(f.info.mem_total_bytes)}", f"bus {f.info.pci_bus_id}"]
    if gen or width:
        parts.append(f"PCIe gen{gen or '?'} x{width or '?'} (max gen{max_gen or '?'} "
                     f"x{max_width or '?'})")
    if f.nvlinks:
        versions = {NVLINK_GBS_PER_LINK[v][0] if v in NVLINK_GBS_PER_LINK else "?"
                    for _, v in f.nvlinks}
        parts.append(f"NVLink {'/'.join(sorted(versions))} x{len(f.nvlinks)}")
    r = f.reading
    if r.util_pct is not None:
        parts.append(f"{r.util_pct:.0f}% busy")
    if r.mem_used_bytes is not None:
        parts.append(f"{_gib(r.mem_used_bytes)} used")
    if r.temp_c is not None:
        parts.append(f"{r.temp_c:.0f} C")
    if f.info.mig:
        parts.append("MIG mode")
    return "  ".join(parts)


def _gib(n: int | None) -> str:
    return "? GiB" if n is None else f"{n / 2**30:.1f} GiB"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
