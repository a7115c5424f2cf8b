"""The α–β prices of the collectives the step-time model uses, in seconds.

Contract: :func:`allreduce_time` (ring: 2(n−1)/n · S/B + 2(n−1)·α_hop + α_launch; Patarasuk &
Yuan 2009, Thakur et al. 2005), :func:`allgather_time` ((n−1)/n · S/B + (n−1)·α_hop +
α_launch) of ``nbytes`` over ``n`` ranks at ``gbps`` per direction (× the profile's link
efficiency), and :func:`dp_exposed`, the data-parallel gradient all-reduce left after its
overlap with the last backward (`autotune.costmodel.step_time`'s module doc).
"""

from __future__ import annotations

from autotune.costmodel.memory import FUSION_FILL, MIB
from autotune.costmodel.profiles import DeviceProfile


def allreduce_time(nbytes: float, n: int, gbps: float, profile: DeviceProfile) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks at ``gbps`` per direction (see doc)."""
    if n <= 1:
        return 0.0
    alpha = (profile.collective_latency_us + 2 * (n - 1) * profile.hop_latency_us) * 1e-6
    return alpha + 2 * (n - 1) / n * nbytes / (gbps * 1e9 * profile.link_efficiency)


def allgather_time(nbytes: float, n: int, gbps: float, profile: DeviceProfile) -> float:
    """Ring all-gather into ``nbytes`` over ``n`` ranks: (n−1)/n · S/B + (n−1)·α_hop + α_launch."""
    if n <= 1:
        return 0.0
    alpha = (profile.collective_latency_us + (n - 1) * profile.hop_latency_us) * 1e-6
    return alpha + (n - 1) / n * nbytes / (gbps * 1e9 * profile.link_efficiency)


def dp_exposed(
    c, profile: DeviceProfile, gbps: float, grad_bytes: float, window: float, n: int
) -> float:
    """Data-parallel gradient all-reduce over ``n`` ranks (dp·cp) left after overlap with the
    last backward."""
    if n <= 1:
        return 0.0
    bucket = max(1.0, c.fusion_mb * MIB * FUSION_FILL)
    buckets = max(1, -(-int(grad_bytes) // int(bucket)))
    alpha = allreduce_time(0.0, n, gbps, profile)
    total = buckets * alpha + allreduce_time(grad_bytes, n, gbps, profile) - alpha
    window *= profile.comm_overlap
    return max(total - window * (buckets - 1) / buckets, total / buckets)
