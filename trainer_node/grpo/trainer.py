"""GRPO with a pluggable data policy. One step reads top to bottom:

    sample -> rollout -> reward      policy.next_requests rounds; engine.generate; verifier
    select                           policy.training_groups / observe / before_update(feedback)
    advantage -> loss -> update      group-relative advantages; the update seams (selection mask,
                                     then weights: grpo/update_seam.py); clipped surrogate; AdamW

Departures from textbook GRPO, all DAPO-style and configurable: clip-higher (eps_high >
eps_low), token-level loss aggregation by default, no KL unless kl_coef > 0, optional soft
overlong penalty. The model is kept in eval mode (no dropout), so the logprobs used for the
loss are those of the distribution that generated the rollouts.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from rlvr_core.engines.base import GenerationEngine, SamplingParams
from trainer_node.grpo.advantages import AdvantageInput, compute_advantages
from trainer_node.grpo.batch import PolicyBatch, collate, flatten_groups
from trainer_node.grpo.cluster_directions import ClusterDirections
from trainer_node.grpo.geometry import head_features
from trainer_node.grpo.gradient_tap import GradientTap
from trainer_node.grpo.logprobs import token_logprobs
from trainer_node.grpo.lookahead import (
    LookaheadHyper,
    clip_gradients,
    get_lookahead_optimizer,
    stepped_state_dict,
)
from trainer_node.grpo.losses import get_loss
from trainer_node.grpo.rollout import GraderFn, RenderFn, RewardFn, rollout_groups
from trainer_node.grpo.settings import GRPOSettings
from trainer_node.grpo.timing import PhaseClock
from trainer_node.grpo.update_seam import UpdateSeams, nothing_kept, seam_metrics
from trainer_node.policies.base import (
    DataPolicy,
    FeedbackContext,
    Group,
    RolloutRequest,
    SourcePool,
    StepRollouts,
)

log = logging.getLogger("trainer_node.grpo")

StepCallback = Callable[[int, dict[str, Any]], None]
MAX_ROUNDS_PER_STEP = 1000  # a policy that never returns [] is a bug; fail loudly


@dataclass(frozen=True)
class LookaheadSnapshot:
    """The live run at one moment, copied: what a lookahead needs (GRPOTrainer.lookahead_snapshot)."""

    trainable: dict[str, torch.Tensor]
    """Each trainable parameter, by name."""
    optimizer_state: dict[str, dict]
    """Each trainable parameter's optimizer state (tensors copied), by name."""
    base: dict[str, torch.Tensor]
    """current_state_dict(): the base model of the query."""
    tap: GradientTap | None = None
    """Filled by the next update with the batch's per-class gradients (grpo/gradient_tap.py);
    None: the candidates are recomputed from the snapshot."""
    directions: ClusterDirections | None = None
    """The clusters' running directions as of the snapshot (grpo.lookahead_directions = cluster_mean)."""


class GRPOTrainer:
    """Owns the live model, its optimizer and the step loop; the policy owns data choices."""

    def __init__(
        self,
        *,
        model: torch.nn.Module,
        tokenizer: Any,
        engine: GenerationEngine,
        policy: DataPolicy,
        pool: SourcePool,
        render: RenderFn,
        reward_fn: RewardFn,
        settings: GRPOSettings,
        sampling: SamplingParams,
        device: str | torch.device = "cpu",
        feedback: FeedbackContext | None = None,
        on_step_end: StepCallback | None = None,
        grader: GraderFn | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.engine = engine
        self.policy = policy
        self.pool = pool
        self.render = render
        self.reward_fn = reward_fn
        self.settings = settings
        self.sampling = sampling  # rollout decoding; its seed is the run seed every rollout seed derives from
        self.device = torch.device(device)
        self.feedback = feedback
        self.on_step_end = on_step_end
        self.loss_fn = get_loss(settings.loss)
        self.lookahead_step = get_lookahead_optimizer(settings.lookahead)
        self.update_seams = UpdateSeams.from_settings(settings)  # identity unless grpo.selection / reweighting
        if grader is None and self.update_seams.grader_draws > 1:  # one-score reward: every draw equal
            from rlvr_core.verifiers.graders import repeat_reward

            grader = repeat_reward(reward_fn)
        self.grader = grader  # several grader draws per rollout (noisy graders, SetGRPO); None: reward_fn
        self.pad_id = _pad_id(tokenizer)
        self.model.eval()  # no dropout: see module docstring
        self.ref_model = _frozen_copy(model) if settings.loss_settings.kl_coef > 0 else None
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=settings.lr,
            betas=settings.betas,
            eps=settings.adam_eps,
            weight_decay=settings.weight_decay,
        )
        self.rollouts_cumulative = 0
        self.step_index = 0  # steps completed; the next step to run
        self.clock = PhaseClock()  # per-phase seconds of each step (grpo/timing.py)
        self._scratch: torch.nn.Module | None = None  # the lookahead's private model copy (snapshots)
        self._pending_tap: GradientTap | None = None  # the next update's (lookahead_snapshot)
        # Each cluster's running direction, fed by every update (grpo/cluster_directions.py); None: candidates
        # step along their cluster's groups of the query's batch.
        self.directions = (ClusterDirections(settings.direction_beta)
                           if settings.lookahead_directions == "cluster_mean" else None)

    # ----------------------------------------------------------------- the step
    def train_step(self) -> dict[str, Any]:
        """Run one GRPO step and return its metrics record."""
        step = self.step_index
        started = time.perf_counter()
        clock = self.clock
        clock.take()  # time between steps belongs to the caller (the loop's hooks time themselves)

        try:
            with clock.phase("sampling"):
                so_far = self.sample_and_rollout(step)                   # sample -> rollout -> reward
                batch = self.policy.training_groups(step, so_far)        # select
                self.policy.observe(step, so_far.groups)
                self.policy.before_update(step, batch, self.feedback)    # feedback phases nest in here
            with clock.phase("update"):
                update_metrics = self.update(batch) if batch else self._skipped_update(step)  # adv -> loss -> update
        finally:
            self.release_lookahead_tap()  # a query's tap that no update filled (gradient_tap.py)

        self.rollouts_cumulative += so_far.rollouts_generated
        self.step_index += 1
        with clock.phase("other"):
            record = self._record(step, so_far, batch, update_metrics, 0.0)
        record.update(clock.take())
        record["step_seconds"] = time.perf_counter() - started
        if self.on_step_end is not None:
            self.on_step_end(step, record)
        return record

    def sample_and_rollout(self, step: int) -> StepRollouts:
        """Ask the policy for prompts round by round, generating and scoring each round."""
        so_far = StepRollouts()
        while requests := self.policy.next_requests(step, so_far):
            if so_far.rounds >= MAX_ROUNDS_PER_STEP:
                raise RuntimeError(f"data policy {self.policy.name!r} asked for more than {MAX_ROUNDS_PER_STEP} rounds")
            so_far.add(self.rollout(step, so_far.rounds, requests))
        return so_far

    def rollout(self, step: int, round_index: int, requests: Sequence[RolloutRequest]) -> list[Group]:
        """Generate and score one round of requests (see grpo/rollout.py)."""
        clock = self.clock

        def timed_reward(text: str, example: Any) -> float:
            with clock.phase("reward"):
                return self.reward_fn(text, example)

        timed_grader = None
        if self.grader is not None:
            grader = self.grader

            def timed_grader(text: str, example: Any, key: Any, draws: int) -> tuple[float, ...]:
                with clock.phase("reward"):
                    return grader(text, example, key, draws)

        with clock.phase("generation"):
            return self._rollout(step, round_index, requests, timed_reward, timed_grader)

    def _rollout(self, step: int, round_index: int, requests: Sequence[RolloutRequest], reward_fn: RewardFn,
                 grader: GraderFn | None = None):
        s = self.settings
        return rollout_groups(
            requests,
            pool=self.pool,
            engine=self.engine,
            render=self.render,
            reward_fn=reward_fn,
            params=self.sampling,
            run_seed=self.sampling.seed,
            step=step,
            round_index=round_index,
            overlong_buffer=s.overlong_buffer,
            overlong_penalty_factor=s.overlong_penalty_factor,
            grader=grader,
            draws=self.update_seams.grader_draws,
        )

    # ------------------------------------------------------- advantage -> loss
    def build_batch(
        self, groups: Sequence[Group], group_weights: Sequence[float] | None = None,
        model: torch.nn.Module | None = None,
    ) -> PolicyBatch:
        """Flatten groups, compute advantages, apply the update seams (selection mask, then
        weights), collate (B, T) tensors, attach ref logprobs. `model` is the policy that generated
        the rollouts (default the live one; a lookahead off the training thread passes its copy)."""
        flat = flatten_groups(groups)
        advantages = compute_advantages(
            self.settings.advantage,
            AdvantageInput(rewards=flat.rewards, group_ids=flat.group_ids, eps=self.settings.adv_eps),
        )
        batch = collate(flat, advantages, self.pad_id, group_weights).to(self.device)
        policy = model or self.model

        def rollout_logprobs(rows: PolicyBatch) -> torch.Tensor:  # the policy that generated the rollouts
            with torch.no_grad():
                return token_logprobs(policy, rows, self.sampling.temperature)[0]

        def response_features(rows: PolicyBatch) -> torch.Tensor:  # the update geometry (grpo/geometry.py)
            return head_features(policy, rows, self.sampling.temperature)

        batch = self.update_seams.weigh(batch, flat.rewards, rollout_logprobs, flat.grader_scores,
                                        response_features)
        if self.ref_model is not None:
            with torch.no_grad():
                ref, _ = token_logprobs(self.ref_model, batch, self.sampling.temperature)
            batch = replace(batch, ref_logprobs=ref)
        return batch

    def micro_batch_loss(
        self, micro: PolicyBatch, with_entropy: bool = False, model: torch.nn.Module | None = None
    ) -> tuple[torch.Tensor, dict[str, float]]:
        logprobs, entropy = token_logprobs(model or self.model, micro, self.sampling.temperature, with_entropy)
        out = self.loss_fn(logprobs, micro, self.settings.loss_settings)
        metrics = dict(out.metrics)
        if entropy is not None:
            mask = micro.completion_mask
            metrics["entropy"] = float((entropy * mask).sum() / micro.token_normaliser())
        return out.loss, metrics

    # ---------------------------------------------------------------- update
    def update(self, groups: Sequence[Group]) -> dict[str, float]:
        """ppo_epochs x mini_batches optimizer steps on the batch, each with grad accumulation."""
        tap, self._pending_tap = self._pending_tap, None
        try:
            return self._update(groups, tap)
        finally:
            if tap is not None and not tap.resolved:
                tap.decline()  # an error mid-update: the background thread recomputes, never hangs

    def _update(self, groups: Sequence[Group], tap: GradientTap | None) -> dict[str, float]:
        s = self.settings
        batch = self.build_batch(groups)
        if tap is not None and not (tap.matches([g.index for g in groups]) and batch.sample_weights is None
                                    and not nothing_kept(batch)):
            tap.decline()  # another batch, or rows the candidates would weigh otherwise: recompute
            tap = None
        if nothing_kept(batch):  # a zero gradient would still move AdamW's momentum: skip instead
            return {**self._skipped_update(self.step_index), **seam_metrics(batch), **self.update_seams.metrics()}
        if s.ppo_epochs * s.mini_batches > 1:  # later passes are off-policy: freeze old logprobs
            with torch.no_grad():
                old, _ = token_logprobs(self.model, batch, self.sampling.temperature)
            batch = replace(batch, old_logprobs=old)
        minis = [replace(m, total_completion_tokens=None, total_sequences=None) for m in batch.split(s.mini_batches)]
        losses: list[float] = []
        sums: dict[str, float] = {}
        norms: list[float] = []
        for _epoch in range(s.ppo_epochs):
            for mini in minis:
                self.optimizer.zero_grad(set_to_none=True)
                if tap is not None:  # one optimizer step per batch (lookahead_snapshot checked it)
                    step_loss, step_metrics = self._tapped_backward(mini, tap)
                elif self.directions is not None:
                    step_loss, step_metrics = self._cluster_backward(mini, groups)
                else:
                    step_loss, step_metrics = self._backward(mini)
                params = [p for p in self.model.parameters() if p.requires_grad]
                norms.append(float(torch.nn.utils.clip_grad_norm_(params, s.max_grad_norm)))
                self.optimizer.step()
                losses.append(step_loss)
                for key, value in step_metrics.items():
                    sums[key] = sums.get(key, 0.0) + value
        self.optimizer.zero_grad(set_to_none=True)
        self.engine.sync_weights()
        count = len(losses)
        out = {"loss": sum(losses) / count, "grad_norm": sum(norms) / count, "update_skipped": 0.0}
        if tap is not None:
            out["lookahead_tapped"] = 1.0  # this update's gradients are the query's candidates' (gradient_tap.py)
        out.update({key: value / count for key, value in sums.items()})
        out["adv_abs_mean"] = float(batch.advantages.abs().mean())
        out["train_rollouts"] = float(batch.size)
        out.update(seam_metrics(batch))
        out.update(self.update_seams.metrics())
        return out

    def _backward(self, mini: PolicyBatch) -> tuple[float, dict[str, float]]:
        """The mini-batch's gradient into .grad, micro-batch by micro-batch; (loss, metric sums)."""
        step_loss = 0.0
        step_metrics: dict[str, float] = {}
        for micro in mini.split(self.settings.grad_accum_steps):
            loss, metrics = self.micro_batch_loss(micro, with_entropy=True)
            loss.backward()
            step_loss += float(loss.detach())
            for key, value in metrics.items():
                step_metrics[key] = step_metrics.get(key, 0.0) + value
        return step_loss, step_metrics

    def _tapped_backward(self, mini: PolicyBatch, tap: GradientTap) -> tuple[float, dict[str, float]]:
        """`_backward`, class by class (grpo/gradient_tap.py): each class's gradient is kept for the
        tap, and .grad gets their sum, the same gradient up to the order of the additions."""
        full = mini.with_normalisers()
        names, class_grads, step_loss, step_metrics = self._class_backward(full, tap.row_classes(full.group_ids),
                                                                           tap.classes)
        tap.fill(names, class_grads)
        return step_loss, step_metrics

    def _cluster_backward(self, mini: PolicyBatch, groups: Sequence[Group]) -> tuple[float, dict[str, float]]:
        """`_backward`, cluster by cluster: each cluster's gradient feeds its running direction
        (grpo/cluster_directions.py), and .grad gets their sum."""
        full = mini.with_normalisers()
        clusters = sorted({g.cluster for g in groups})
        position = {c: k for k, c in enumerate(clusters)}
        of_group = torch.tensor([position[g.cluster] for g in groups], dtype=torch.long, device=full.group_ids.device)
        row_cluster = of_group[full.group_ids]
        names, class_grads, step_loss, step_metrics = self._class_backward(full, row_cluster, len(clusters))
        present = set(full.group_ids.tolist())
        counts = {c: sum(1 for i, g in enumerate(groups) if g.cluster == c and i in present) for c in clusters}
        self.directions.record(names, dict(zip(clusters, class_grads, strict=True)), counts, len(present))
        return step_loss, step_metrics

    def _class_backward(
        self, full: PolicyBatch, row_class: torch.Tensor, classes: int
    ) -> tuple[list[str], list[list[torch.Tensor]], float, dict[str, float]]:
        """One backward pass per class of rows (whole-batch normalisers): .grad gets their sum (a
        parameter no row's loss reaches keeps .grad None); returns (parameter names, each class's
        gradients, summed loss, summed metrics)."""
        named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        params = [p for _, p in named]
        step_loss = 0.0
        step_metrics: dict[str, float] = {}
        class_grads: list[list[torch.Tensor]] = []
        used = [False] * len(params)
        for k in range(classes):
            rows = torch.nonzero(row_class == k).flatten()
            if not len(rows):
                class_grads.append([torch.zeros_like(p) for p in params])
                continue
            grads, reached, loss, metrics = self._accumulated_gradients(full.rows(rows), params, with_entropy=True)
            class_grads.append(grads)
            used = [a or b for a, b in zip(used, reached)]
            step_loss += loss
            for key, value in metrics.items():
                step_metrics[key] = step_metrics.get(key, 0.0) + value
        for i, param in enumerate(params):
            if used[i]:
                total = class_grads[0][i].clone()
                for grads in class_grads[1:]:
                    total.add_(grads[i])
                param.grad = total
        return [n for n, _ in named], class_grads, step_loss, step_metrics

    def _skipped_update(self, step: int) -> dict[str, float]:
        log.info("step %d: every group was filtered out; skipping the update", step)
        return {"loss": float("nan"), "update_skipped": 1.0, "train_rollouts": 0.0}

    # ------------------------------------------------------ lookahead (L2RR)
    def current_state_dict(self) -> dict[str, torch.Tensor]:
        """The live model's parameters and buffers: a copy of everything training changes, the
        live tensors themselves for what it never changes (frozen weights, buffers)."""
        trained = {id(p) for p in self.model.parameters() if p.requires_grad}
        return {
            k: v.detach().clone() if id(v) in trained else v.detach()
            for k, v in self.model.state_dict(keep_vars=True).items()
        }

    def lookahead_state_dicts(
        self, batch: Sequence[Group], weights: Sequence[Sequence[float]]
    ) -> list[dict[str, torch.Tensor]]:
        """For each weight vector (one weight per group of `batch`), the parameters after ONE
        update from the current ones with the group-weighted loss; live state is untouched.

        The update mirrors a real step (same loss, grad clipping) with the lookahead optimizer
        grpo.lookahead (see grpo/lookahead.py for why AdamW-from-a-state-copy is the default).
        Each candidate's forward and backward run on the rows its weights keep, with the whole
        batch's normalisers: the gradient equals that of the zero-weighted full batch, and C
        one-cluster candidates cost about one batch of backward work, not C.
        """
        with self.clock.phase("candidates"):
            return self._lookahead(self.model, self._live_optimizer_state(), batch, weights)

    def scratch_model(self) -> torch.nn.Module:
        """The trainer's private model copy (made once): lookahead snapshots build candidates on it, and
        a difference release's clip is measured on it (feedback/clip_calibration.py), never on the live model."""
        if self._scratch is None:
            self._scratch = copy.deepcopy(self.model)
        return self._scratch

    def direction_clusters(self) -> list[str]:
        """Clusters a candidate can be built for from a running direction ([] without cluster_mean)."""
        return self.directions.clusters() if self.directions is not None else []

    def direction_state_dicts(self, mixtures: Sequence[Mapping[str, float]]) -> list[dict[str, torch.Tensor]]:
        """For each cluster mixture (cluster name -> share), the parameters after one lookahead step
        along sum_c share_c * D_c from the current ones (grpo/cluster_directions.py); live state is
        untouched. Clipped and stepped as `lookahead_state_dicts` steps its gradients."""
        if self.directions is None:
            raise RuntimeError("direction candidates need grpo.lookahead_directions = 'cluster_mean'")
        with self.clock.phase("candidates"):
            return self._direction_steps(self.model, self._live_optimizer_state(), self.directions, mixtures)

    def _direction_steps(self, model: torch.nn.Module, optimizer_state: Mapping[str, dict],
                         directions: ClusterDirections, mixtures: Sequence[Mapping[str, float]]) -> list[dict]:
        hyper = self._lookahead_hyper()
        results = []
        for shares in mixtures:
            clipped = clip_gradients(directions.mixture(shares), self.settings.max_grad_norm)
            by_name = dict(zip(directions.names, clipped, strict=True))
            results.append(stepped_state_dict(model, by_name, optimizer_state, self.lookahead_step, hyper))
        return results

    def directions_from_snapshot(
        self, snapshot: LookaheadSnapshot, mixtures: Sequence[Mapping[str, float]]
    ) -> list[dict[str, torch.Tensor]]:
        """`direction_state_dicts` as of the snapshot, on the private model copy (safe beside training)."""
        if snapshot.directions is None:
            raise RuntimeError("this snapshot holds no cluster directions")
        scratch = self._load_scratch(snapshot)
        return self._frozen_live(self._direction_steps(scratch, snapshot.optimizer_state, snapshot.directions,
                                                       mixtures), snapshot)

    def lookahead_snapshot(
        self, batch: Sequence[Group] | None = None, weights: Sequence[Sequence[float]] | None = None
    ) -> LookaheadSnapshot:
        """The live run's parameters and optimizer state as they are now, copied, for
        `lookahead_from_snapshot` on another thread while training goes on (asynchronous feedback).

        Given the query's batch and weights, and when grpo.lookahead_from_update allows, the
        snapshot carries a gradient tap that the next update of that batch fills
        (grpo/gradient_tap.py): the candidates then need no forward or backward pass of their own."""
        with self.clock.phase("candidates"):
            self.release_lookahead_tap()
            self.scratch_model()
            trainable = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
            state = {
                n: {k: v.detach().clone() if isinstance(v, torch.Tensor) else v
                    for k, v in self.optimizer.state.get(p, {}).items()}
                for n, p in self.model.named_parameters() if p.requires_grad
            }
            tap = self._new_tap(batch, weights)
            self._pending_tap = tap
            directions = self.directions.copy() if self.directions is not None else None
            return LookaheadSnapshot(trainable, state, self.current_state_dict(), tap, directions)

    def _new_tap(self, batch: Sequence[Group] | None, weights: Sequence[Sequence[float]] | None) -> GradientTap | None:
        s = self.settings
        # several optimizer steps per batch: the first one's gradient is not the batch's at theta_t
        if not s.lookahead_from_update or batch is None or not weights or s.ppo_epochs * s.mini_batches > 1:
            return None
        if self.directions is not None:  # candidates step along the clusters' running directions
            return None
        if any(len(vector) != len(batch) for vector in weights):
            return None  # _lookahead names the mistake when the candidates are recomputed
        tap = GradientTap([g.index for g in batch], weights)
        return tap if tap.usable() else None

    def release_lookahead_tap(self) -> None:
        """Decline a tap no update has resolved yet. Called before the training thread waits for
        the background thread, which may be waiting for the tap (grpo/gradient_tap.py)."""
        tap, self._pending_tap = self._pending_tap, None
        if tap is not None:
            tap.decline()

    def lookahead_from_snapshot(
        self, snapshot: LookaheadSnapshot, batch: Sequence[Group], weights: Sequence[Sequence[float]]
    ) -> list[dict[str, torch.Tensor]]:
        """`lookahead_state_dicts` as of the snapshot, computed on a private copy of the model (safe
        beside the training thread: nothing live is written, and the phase clock is not used)."""
        scratch = self._load_scratch(snapshot)
        if snapshot.tap is not None and snapshot.tap.wait():
            try:
                out = self._tapped_lookahead(scratch, snapshot.optimizer_state, snapshot.tap)
            finally:
                snapshot.tap.clear()  # K gradient copies: not kept through the upload and the owner's wait
        else:
            out = self._lookahead(scratch, snapshot.optimizer_state, batch, weights)
        return self._frozen_live(out, snapshot)

    def _load_scratch(self, snapshot: LookaheadSnapshot) -> torch.nn.Module:
        """The private model copy, holding the snapshot's trainable parameters."""
        scratch = self._scratch
        with torch.no_grad():
            for name, param in scratch.named_parameters():
                if name in snapshot.trainable:
                    param.copy_(snapshot.trainable[name])
        return scratch

    def _frozen_live(self, out: list[dict[str, torch.Tensor]], snapshot: LookaheadSnapshot) -> list[dict]:
        """Frozen tensors of each candidate: the live ones (never modified), so the writer skips them.
        Trained means a trainable parameter under any of its keys: a tied alias (lm_head.weight of
        tied embeddings, absent from named_parameters) keeps its stepped value."""
        live = self.model.state_dict(keep_vars=True)
        trained = {key for key, tensor in live.items() if isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad}
        for state in out:
            for name in state:
                if name not in trained and name in live:
                    state[name] = live[name].detach()
        return out

    def _live_optimizer_state(self) -> dict[str, dict]:
        return {n: self.optimizer.state.get(p, {}) for n, p in self.model.named_parameters() if p.requires_grad}

    def _lookahead(
        self, model: torch.nn.Module, optimizer_state: dict[str, dict], batch: Sequence[Group],
        weights: Sequence[Sequence[float]],
    ) -> list[dict[str, torch.Tensor]]:
        s = self.settings
        if not batch:
            raise ValueError("lookahead needs a non-empty batch")
        base = self.build_batch(batch, model=model).with_normalisers()  # (B, T); normalisers of the whole batch
        hyper = self._lookahead_hyper()
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        results = []
        for vector in weights:
            if len(vector) != len(batch):
                raise ValueError(f"lookahead weights have {len(vector)} entries for {len(batch)} groups")
            row_weights = torch.tensor(list(vector), dtype=torch.float32, device=self.device)[base.group_ids]  # (B,)
            rows = torch.nonzero(row_weights != 0).flatten()
            if len(rows) == 0:
                grads = [torch.zeros_like(p) for _, p in named]
            else:
                kept = replace(base, sample_weights=row_weights).rows(rows)  # zero-weight rows add exactly 0
                grads = self._gradients(kept, [p for _, p in named], model)
            clipped = clip_gradients(grads, s.max_grad_norm)
            by_name = {n: g for (n, _), g in zip(named, clipped)}
            results.append(stepped_state_dict(model, by_name, optimizer_state, self.lookahead_step, hyper))
        return results

    def _lookahead_hyper(self) -> LookaheadHyper:
        s = self.settings
        return LookaheadHyper(
            lr=s.lookahead_lr if s.lookahead_lr is not None else s.lr,
            betas=s.betas,
            eps=s.adam_eps,
            weight_decay=s.weight_decay,  # the rule decides whether it decays (SGD does not)
        )

    def _tapped_lookahead(
        self, model: torch.nn.Module, optimizer_state: dict[str, dict], tap: GradientTap
    ) -> list[dict[str, torch.Tensor]]:
        """`_lookahead`'s candidates from a filled tap: the same clipped step, no backward pass."""
        hyper = self._lookahead_hyper()
        results = []
        for candidate in range(tap.candidates):
            clipped = clip_gradients(tap.candidate_gradient(candidate), self.settings.max_grad_norm)
            by_name = dict(zip(tap.names, clipped))  # the live model's names: the scratch copy's too
            results.append(stepped_state_dict(model, by_name, optimizer_state, self.lookahead_step, hyper))
        return results

    def _gradients(
        self, batch: PolicyBatch, params: list[torch.Tensor], model: torch.nn.Module | None = None
    ) -> list[torch.Tensor]:
        """d loss / d params via autograd.grad, so the live .grad fields are never written."""
        return self._accumulated_gradients(batch, params, model)[0]

    def _accumulated_gradients(
        self, batch: PolicyBatch, params: list[torch.Tensor], model: torch.nn.Module | None = None,
        with_entropy: bool = False,
    ) -> tuple[list[torch.Tensor], list[bool], float, dict[str, float]]:
        """Micro-batch by micro-batch with autograd.grad: (gradients, whether any micro-batch reached
        each parameter, summed loss, summed metrics); the live .grad fields are never written."""
        totals = [torch.zeros_like(p) for p in params]
        reached = [False] * len(params)
        loss_sum = 0.0
        metric_sums: dict[str, float] = {}
        for micro in batch.split(self.settings.grad_accum_steps):
            loss, metrics = self.micro_batch_loss(micro, with_entropy=with_entropy, model=model)
            for i, grad in enumerate(torch.autograd.grad(loss, params, allow_unused=True)):
                if grad is not None:
                    totals[i].add_(grad)
                    reached[i] = True
            loss_sum += float(loss.detach())
            for key, value in metrics.items():
                metric_sums[key] = metric_sums.get(key, 0.0) + value
        return totals, reached, loss_sum, metric_sums

    # --------------------------------------------------------------- records
    def _record(
        self, step: int, so_far: StepRollouts, batch: Sequence[Group], update: dict[str, float], seconds: float
    ) -> dict[str, Any]:
        generated = [r for g in so_far.groups for r in g.rollouts if not r.reused]
        rewards = [r.reward for r in generated]
        lengths = [len(r.completion_ids) for r in generated]
        trained = {g.index for g in batch}  # policies may hand back copies, so match by prompt
        record: dict[str, Any] = {
            "step": step,
            "loss": update["loss"],
            "reward_mean": sum(rewards) / len(rewards) if rewards else float("nan"),
            "rollouts_step": so_far.rollouts_generated,
            "rollouts_cumulative": self.rollouts_cumulative,
            "groups_total": len(so_far.groups),
            "groups_filtered": sum(1 for g in so_far.groups if g.index not in trained),
            "groups_trained": len(batch),
            "zero_variance_groups": sum(1 for g in so_far.groups if g.zero_variance),
            "generation_rounds": so_far.rounds,
            "completion_len_mean": sum(lengths) / len(lengths) if lengths else 0.0,
            "step_seconds": seconds,
        }
        record.update({k: v for k, v in update.items() if k != "loss"})
        by_cluster: dict[str, list[float]] = {}
        for group in so_far.groups:
            by_cluster.setdefault(group.cluster, []).extend(r.reward for r in group.rollouts if not r.reused)
        record.update({f"reward/{c}": sum(v) / len(v) for c, v in sorted(by_cluster.items()) if v})
        record.update(self.policy.metrics())
        return record


def _pad_id(tokenizer: Any) -> int:
    for attribute in ("pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, attribute, None)
        if isinstance(value, int):
            return value
    return 0


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref
