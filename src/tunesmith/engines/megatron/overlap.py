"""overlap_grad_reduce: the data-parallel gradient sum started during the step's last backward.

Without it the engine sums every gradient over the data-parallel group after the backward (parallel.py). With
it, each parameter's gradient hook (fired once its gradient of the step's last micro-batch is accumulated) marks
it ready; a bucket of about BUCKET_BYTES whose parameters are all ready is flattened and all-reduced without
waiting, while the backward goes on with the earlier layers. Buckets are launched strictly in their order, so
every rank issues the same collectives in the same order: in the first step the parameters in reverse order,
then in the order their gradients came in the first step on the group's first rank (as DDP rebuilds its
buckets). step() launches what is left (parameters whose gradient never came this step, as zeros) and waits for
all of them.

A parameter without a gradient on some ranks (a vision tower no image reached there) takes zeros there; one
without a gradient on any rank keeps none (each bucket carries a presence flag per parameter, summed with it),
as parallel.sum_over_data_parallel does. An expert's gradient is summed over the expert-data-parallel group in
buckets of its own. The schedule arms it before the step's last backward (schedule.py: the last micro-batch's,
with or without pipeline stages).
"""

from __future__ import annotations

import atexit
import weakref

import torch
import torch.distributed as tdist

from ...errors import TunesmithError

BUCKET_BYTES = 64 * 2**20  # small enough that the first buckets leave while most of the backward is still to run


class _Bucket:
    def __init__(self, params: list, group):
        self.params, self.group = params, group
        self.waiting = len(params)
        self.flat = self.work = None

    def launch(self) -> None:
        """All-reduce the bucket without waiting; each gradient becomes a view of the flat buffer the sum lands in
        (the separate gradient tensors are freed: no copy back, no second gradient in memory)."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        present = torch.tensor([float(p.grad is not None) for p in self.params], dtype=grads[0].dtype,
                               device=grads[0].device)
        self.flat = torch.cat([g.reshape(-1) for g in grads] + [present])
        offset = 0
        for param in self.params:
            param.grad = self.flat[offset:offset + param.numel()].view_as(param)
            offset += param.numel()
        self.work = tdist.all_reduce(self.flat, group=self.group, async_op=True)

    def finish(self) -> None:
        self.work.wait()
        for param, count in zip(self.params, self.flat[-len(self.params):].tolist()):
            if count == 0:  # no rank had a gradient for it: none, so the optimizer skips it
                param.grad = None
        self.flat = self.work = None
        self.waiting = len(self.params)


def buckets(tensors: list, limit: int, together=lambda a, b: True) -> list[list]:
    """`tensors` in order, in runs of about `limit` bytes each of one dtype whose members `together(first, t)`
    accepts: the flat buckets of a gradient sum."""
    out, bucket, size = [], [], 0
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and (size + nbytes > limit or tensor.dtype != bucket[0].dtype or not together(bucket[0], tensor)):
            out.append(bucket)
            bucket, size = [], 0
        bucket.append(tensor)
        size += nbytes
    return out + ([bucket] if bucket else [])


def _buckets(params: list, group_of) -> list[_Bucket]:
    """`params` in buckets of about BUCKET_BYTES (one group and one dtype each), in the given order."""
    runs = buckets(params, BUCKET_BYTES, lambda first, param: group_of(param) is group_of(first))
    return [_Bucket(run, group_of(run[0])) for run in runs]


class OverlappedGradSum:
    """The data-parallel sum of `params`' gradients, bucket by bucket as the armed backward produces them.
    `group_of` gives a parameter's data-parallel group (an expert's: its expert-data-parallel group); every
    bucket, whatever its group, leaves in one order, so that no two ranks queue their collectives on the groups'
    communicators in different orders. `order_group` (the replicas, parallel.replica_group, which hold every
    expert-data-parallel group) agrees on that order after the first step."""

    def __init__(self, params: list, group_of, order_group):
        self.group_of, self.order_group = group_of, order_group
        self.params = list(params)
        self._bucket(list(reversed(self.params)))  # until the first step shows the order the backward gives them
        self.order_known = False
        self.armed = False
        self.ready: list = []  # the parameters whose final gradient came, in the order they came
        self.seen: set = set()  # their ids
        self.hooks = [param.register_post_accumulate_grad_hook(self._on_grad) for param in self.params]
        # A process group still referenced when the interpreter tears down is destroyed after gloo's own state and
        # aborts the process ("terminate called without an active exception", seen on 2 gloo processes): let go
        # of the groups, buckets and hooks at exit (through a weak reference: nothing kept alive until then).
        atexit.register(_close_if_alive, weakref.ref(self))

    def _bucket(self, order: list) -> None:
        self.sequence = _buckets(order, self.group_of)
        self.bucket_of = {id(p): b for b in self.sequence for p in b.params}
        self.next = 0  # the first bucket not yet launched

    def close(self) -> None:
        """Remove the gradient hooks and let go of the groups and buckets (the object is not used after)."""
        for hook in self.hooks:
            hook.remove()
        self.hooks, self.params, self.sequence, self.bucket_of, self.ready = [], [], [], {}, []
        self.group_of = self.order_group = None

    def arm(self) -> None:
        """The next backward is the step's last: its gradients are final when their hooks fire."""
        self.armed = True

    def _on_grad(self, param) -> None:
        if not self.armed:
            return
        if id(param) in self.seen:
            raise TunesmithError("overlap_grad_reduce: a parameter's gradient arrived twice in the step's last "
                                 "backward (after its data-parallel sum had started); set overlap_grad_reduce: false")
        self.seen.add(id(param))
        self.ready.append(param)
        self.bucket_of[id(param)].waiting -= 1
        while self.next < len(self.sequence) and self.sequence[self.next].waiting == 0:
            self.sequence[self.next].launch()
            self.next += 1

    def finish(self) -> None:
        """Launch the buckets left (gradients that never came this step), in order, and wait for every sum. After
        the first step the buckets follow the order its gradients came in on the data-parallel group's first rank
        (a parameter the backward reaches late, a vision tower's, would otherwise hold back every bucket after
        it). Called on every rank after every step, so the one-time agreement is collective everywhere."""
        for bucket in self.sequence[self.next:]:
            bucket.launch()
        for bucket in self.sequence:
            bucket.finish()
        if not self.order_known:
            self._bucket(self._first_rank_order())
            self.order_known = True
        self.armed, self.ready, self.seen, self.next = False, [], set(), 0

    def _first_rank_order(self) -> list:
        """The parameters in the order their gradients came on the order group's first rank (those that did not
        come last, in the order they had)."""
        position = {id(p): i for i, p in enumerate(self.params)}
        came = [position[id(p)] for p in self.ready]
        seen = set(came)
        order = [came + [i for i in reversed(range(len(self.params))) if i not in seen]]
        tdist.broadcast_object_list(order, src=tdist.get_global_rank(self.order_group, 0), group=self.order_group)
        return [self.params[i] for i in order[0]]


def _close_if_alive(ref) -> None:
    summed = ref()
    if summed is not None:
        summed.close()
