"""``pgc-fr`` / ``pgc-cr``: pipelined gradient coding.

Same placement and coefficients as ``gc-fr`` / ``gc-cr``, but each worker computes ONE partition per
step (at step 0 it computes all s + 1 to fill the pipeline) and sends ``sum_p B[i, p] g_p`` over its
most recent gradient of each partition it holds; a step's message therefore spans the s + 1 most
recent partition gradients the worker computed.

Schedule (aligned): at step t worker i computes the partition p of its support with
``p = t (mod s + 1)``. Under FR every member of a group then computes the same partition at the same
step; under CR with (s + 1) | n every window i..i+s holds each residue once, so again every holder of
p computes p at the same steps (t = p mod (s + 1)). **pgc-cr needs (s + 1) | n** and is refused
otherwise (``coding.check_code(pipelined=True)``, at config time too): a window i..i+s then misses
some residue and repeats another, so no schedule of one partition per step keeps every holder of a
partition on one version; the holders would hold different versions and the decode would mix them
(measured before the refusal: at n = 10, s = 3, no step after the warm-up was exact, with a
partition's versions weighted up to 344x its share).

What a decode contains (``Combination.contents``, tested):

- If every worker whose message is used computed partition p at the same step v_p, the decode is
  exactly ``(1/n) sum_p g_p(theta_{v_p})``: every partition once, weight 1/n, with v_p the last step
  <= t at which p was scheduled, so staleness t - v_p is in 0..s (0 for the partition computed this
  step). This holds at every step without stragglers.
- A worker cut off at step t' (a straggler; its emulated compute was cancelled) lacks the version
  of the partition scheduled at t' that the other holders have. **Catch-up** (default for CR): the
  policy tracks every worker's versions from its arrivals, and the worker's next task adds
  ``catch_up=((p, t'),)``: finish p at the parameters published at step t' (the runtime keeps the
  last s + 2 parameter sets; the worker resumes the cut-short computation, paying only the part not
  yet done), so it holds the same version as the other holders again. The cost is up to one extra
  partition for that worker in that step (``partitions_per_step`` is the median, 1; the mean shows
  the catch-ups). With catch-up every arrival's versions match the schedule unless the worker was
  cut off again, and the decode is exact as above.
- Without catch-up (``catch_up=False``; FR's default, as FR never mixes holders), or while a worker
  is cut off repeatedly:
  - pgc-fr uses, per group, the arrived member with the most complete, freshest message, so its
    decode stays every partition once with weight 1/n, but **its staleness is not bounded by s**:
    a member cut off whenever partition p is scheduled keeps an old g_p, and if the group's only
    arrival at a later step is that member, the decode uses it (``bench stragglers`` at s = 1
    measured a max staleness of 11). ``catch_up=True`` bounds it at s for pgc-fr too, at the
    catch-ups' extra compute (right after the warm-up, a group whose arrived members were all cut
    off at step 0 lacks the partitions they never computed: ``Combination.missing``).
  - pgc-cr cannot choose (n - s arrivals fix the decoding vector): p's total weight 1/n splits over
    two versions, ``w_new g_p(v) + w_old g_p(v')`` with ``w_new + w_old = 1/n`` and weights of either
    sign, large when the CR matrix is badly conditioned (seen: 20x). The error is
    ``w_old (g_p(v') - g_p(v))``: the weight times how much p's gradient changed between the
    versions; ``Combination.mix`` reports the weight (1.0 = clean) and ``exact`` is False then.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pdml_ray.stragglers.coding import check_code
from pdml_ray.stragglers.policies.gc import GradientCodingPolicy
from pdml_ray.stragglers.policy import Arrival, Combination, WorkerTask, make_combination


class PipelinedGradientCoding(GradientCodingPolicy):

    def __init__(self, workers: int, stragglers: int, seed: int = 0, *, catch_up: bool | None = None) -> None:
        check_code(workers, stragglers, self.scheme, pipelined=True)
        super().__init__(workers, stragglers, seed)
        # FR never mixes holders (one member per group is used), so catch-up would only buy freshness
        self.catch_up = (self.scheme == "cr") if catch_up is None else catch_up
        self._known: dict[int, dict[int, int]] = {}  # worker -> partition -> version it holds (from arrivals)

    def scheduled(self, worker: int, step: int) -> int:
        """The partition ``worker`` computes at ``step`` (> 0): the one of its support with
        ``p = step (mod s + 1)`` (one exists, as (s + 1) | n)."""
        k = self.s + 1
        return next(p for p in self.code.supports[worker] if p % k == step % k)

    def expected_version(self, worker: int, partition: int, step: int) -> int:
        """The step whose parameters ``worker``'s gradient of ``partition`` should come from, before
        ``step``'s own compute: the last t < step at which it was scheduled (0: the warm-up)."""
        for t in range(step - 1, 0, -1):
            if self.scheduled(worker, t) == partition:
                return t
        return 0

    def task(self, worker: int, step: int) -> WorkerTask:
        if step == 0:
            return WorkerTask(worker, step, self.placement(worker), self.code.coefficients(worker))
        now = self.scheduled(worker, step)
        catch_up: tuple[tuple[int, int], ...] = ()
        if self.catch_up:
            held = self._known.get(worker, {})
            catch_up = tuple((p, e) for p in self.placement(worker) if p != now
                             for e in [self.expected_version(worker, p, step)] if held.get(p, -1) < e)
        return WorkerTask(worker, step, (now,), self.code.coefficients(worker), catch_up)

    def ready(self, step: int, arrivals: Mapping[int, Arrival], alive: frozenset[int]) -> bool:
        return self.code.decodable(arrivals)

    def combine(self, step: int, arrivals: Sequence[Arrival]) -> Combination:
        for a in arrivals:
            self._known[a.worker] = a.versions()
        if self.scheme == "fr":  # per group: the arrived member with the most complete, freshest message
            chosen: dict[int, Arrival] = {}
            for a in arrivals:
                group = a.worker // (self.s + 1)
                if group not in chosen or (len(a.terms), a.oldest) > (len(chosen[group].terms), chosen[group].oldest):
                    chosen[group] = a
            weights = {a.worker: 1.0 / self.n for a in chosen.values()}
            decoding = self.code.decode(weights)
            assert decoding is not None  # one member of every group
            return make_combination(step, weights, arrivals, self.n, decoding.error_bound,
                                    f"pipelined FR: freshest arrived member of each of {len(chosen)} groups")
        weights, err = self.decode_weights(step, arrivals)
        return make_combination(step, weights, arrivals, self.n, err,
                                "pipelined CR decode")


class PipelinedFR(PipelinedGradientCoding):
    name = "pgc-fr"
    scheme = "fr"


class PipelinedCR(PipelinedGradientCoding):
    name = "pgc-cr"
    scheme = "cr"
