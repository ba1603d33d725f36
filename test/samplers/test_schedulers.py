"""Parameter schedulers: exact sequences, bounds, state round trips (issue 14)."""

from __future__ import annotations

import pickle

import pytest
import torch

from torchrl.data import (
    LazyTensorStorage,
    PrioritizedReplayBuffer,
    PrioritizedSampler,
    RandomSampler,
    StalenessAwareSampler,
)
from torchrl.data.replay_buffers.checkpointers import dump_component, load_component
from torchrl.data.replay_buffers.scheduler import (
    LambdaScheduler,
    LinearScheduler,
    ParameterScheduler,
    SchedulerList,
    StepScheduler,
)


def halve(step: int) -> float:
    return 0.5**step


def run(scheduler, obj, steps: int, name: str = "beta") -> list:
    out = []
    for _ in range(steps):
        scheduler.step()
        value = getattr(obj, name)
        out.append(round(float(value), 6))
    return out


def sampler(beta=0.4, alpha=0.6) -> PrioritizedSampler:
    return PrioritizedSampler(16, alpha=alpha, beta=beta)


# -- exact sequences ------------------------------------------------------------------------------------------------
def test_linear_scheduler_reaches_the_final_value_and_stays():
    s = sampler(beta=0.4)
    assert run(LinearScheduler(s, "beta", final_value=1.0, num_steps=4), s, 6) == [0.55, 0.7, 0.85, 1.0, 1.0, 1.0]
    s = sampler(alpha=0.6)
    assert run(LinearScheduler(s, "alpha", final_value=0.0, num_steps=2), s, 3, "alpha") == [0.3, 0.0, 0.0]


def test_step_scheduler_multiplies_or_adds_every_n_steps_within_bounds():
    s = sampler(beta=0.8)
    scheduler = StepScheduler(s, "beta", gamma=0.5, n_steps=2, min_value=0.15)
    assert run(scheduler, s, 7) == [0.8, 0.4, 0.4, 0.2, 0.2, 0.15, 0.15]
    s = sampler(beta=0.4)
    scheduler = StepScheduler(s, "beta", gamma=0.25, mode="additive", max_value=1.0)
    assert run(scheduler, s, 4) == [0.65, 0.9, 1.0, 1.0]
    assert scheduler.operator(2, 3) == 5


def test_lambda_scheduler_scales_the_initial_value():
    s = sampler(beta=0.8)
    assert run(LambdaScheduler(s, "beta", halve), s, 3) == [0.4, 0.2, 0.1]
    s = sampler(beta=0.8)
    assert run(LambdaScheduler(s, "beta", halve, min_value=0.3), s, 3) == [0.4, 0.3, 0.3]
    s = sampler(beta=0.5)
    assert run(LambdaScheduler(s, "beta", lambda step: 1 + step, max_value=1.2), s, 3) == [1.0, 1.2, 1.2]


def test_a_custom_scheduler_subclasses_parameter_scheduler():
    class Countdown(ParameterScheduler):
        def _step(self):
            return self.initial_val - self._step_cnt

    s = StalenessAwareSampler(max_staleness=3)
    assert run(Countdown(s, "max_staleness", min_value=0), s, 5, "max_staleness") == [2, 1, 0, 0, 0]
    assert isinstance(s.max_staleness, int)
    with pytest.raises(TypeError):
        ParameterScheduler(s, "max_staleness")  # abstract


def test_a_replay_buffer_schedules_its_sampler_and_annealing_changes_the_weights():
    rb = PrioritizedReplayBuffer(alpha=0.7, beta=0.0, storage=LazyTensorStorage(8), batch_size=4)
    rb.extend(torch.arange(8))
    rb.update_priority(torch.arange(8), torch.arange(1.0, 9.0))
    scheduler = LinearScheduler(rb, "beta", final_value=1.0, num_steps=2)
    assert scheduler.sampler is rb.sampler and scheduler.initial_val == 0.0
    assert torch.allclose(torch.as_tensor(rb.sample(return_info=True)[1]["priority_weight"]).double(),
                          torch.ones(4, dtype=torch.float64))
    scheduler.step(), scheduler.step()
    assert rb.sampler.beta == 1.0
    weights = torch.as_tensor(rb.sample(return_info=True)[1]["priority_weight"])
    assert (weights <= 1).all() and (weights < 1).any()


def test_a_tensor_attribute_is_updated_in_place():
    class Holder:
        def __init__(self):
            self.beta = torch.tensor(0.5)

    holder = Holder()
    shared = holder.beta
    scheduler = StepScheduler(holder, "beta", gamma=0.5, min_value=0.2)
    run(scheduler, holder, 2)
    assert holder.beta is shared and float(shared) == pytest.approx(0.2)
    assert isinstance(scheduler.state_dict()["initial_val"], torch.Tensor)


def test_scheduler_list_steps_every_scheduler_in_order():
    s = sampler(beta=0.4, alpha=0.6)
    schedulers = SchedulerList(LinearScheduler(s, "beta", final_value=1.0, num_steps=3))
    schedulers.append(StepScheduler(s, "alpha", gamma=0.5))
    assert len(schedulers) == 2
    schedulers.step(), schedulers.step()
    assert (round(s.beta, 6), round(s.alpha, 6)) == (0.8, 0.15)
    assert len(SchedulerList([])) == 0
    with pytest.raises(TypeError, match="SchedulerList holds ParameterScheduler objects, got RandomSampler"):
        schedulers.append(RandomSampler())


# -- state -----------------------------------------------------------------------------------------------------------
def _pairs():
    """(make scheduler over a sampler, name) for each scheduler class."""
    return [
        (lambda s: LinearScheduler(s, "beta", final_value=1.0, num_steps=5), "linear"),
        (lambda s: StepScheduler(s, "beta", gamma=1.2, n_steps=2, max_value=0.9), "step"),
        (lambda s: LambdaScheduler(s, "beta", halve, min_value=0.05), "lambda"),
    ]


@pytest.mark.parametrize("make,name", _pairs(), ids=[n for _, n in _pairs()])
@pytest.mark.parametrize("how", ["state_dict", "checkpoint", "pickle"])
def test_a_restored_scheduler_continues_the_same_schedule(make, name, how, tmp_path):
    s = sampler(beta=0.4)
    scheduler = make(s)
    run(scheduler, s, 3)
    restored_sampler = sampler(beta=0.4)
    restored_sampler.load_state_dict(s.state_dict())  # the parameter comes back with its owner
    if how == "pickle":  # halve, the lambda_fn, is a module-level function: picklable
        restored = pickle.loads(pickle.dumps(scheduler))
        restored_sampler = restored.obj
    else:
        restored = make(restored_sampler)
        if how == "state_dict":
            restored.load_state_dict(scheduler.state_dict())
        else:
            dump_component(scheduler, tmp_path / "scheduler")
            load_component(restored, tmp_path / "scheduler")
    assert restored._step_cnt == 3 and restored.initial_val == 0.4
    assert run(restored, restored_sampler, 5) == run(scheduler, s, 5)


def test_scheduler_list_state_round_trip():
    def build(s):
        return SchedulerList([LinearScheduler(s, "beta", final_value=1.0, num_steps=4),
                              StepScheduler(s, "alpha", gamma=0.9)])

    s = sampler()
    schedulers = build(s)
    schedulers.step()
    state = schedulers.state_dict()
    other = sampler()
    other.load_state_dict(s.state_dict())
    restored = build(other)
    restored.load_state_dict(state)
    schedulers.step(), restored.step()
    assert (other.beta, other.alpha) == (s.beta, s.alpha)
    with pytest.raises(ValueError, match="holds 2 schedulers and this SchedulerList 1"):
        SchedulerList([LinearScheduler(other, "beta", 1.0, 2)]).load_state_dict(state)


def test_a_state_of_another_parameter_is_refused():
    s = sampler()
    state = LinearScheduler(s, "beta", 1.0, 3).state_dict()
    with pytest.raises(ValueError, match="schedules 'beta', and this scheduler 'alpha'"):
        LinearScheduler(s, "alpha", 1.0, 3).load_state_dict(state)
    with pytest.raises(ValueError, match="_step_cnt"):
        LinearScheduler(s, "beta", 1.0, 3).load_state_dict(dict(state, _step_cnt=-1))


# -- errors ---------------------------------------------------------------------------------------------------------
def test_arguments_are_validated():
    s = sampler()
    with pytest.raises(TypeError, match="`param_name` must be the name of an attribute"):
        LinearScheduler(s, 3, 1.0, 2)
    with pytest.raises(AttributeError, match="PrioritizedSampler has no attribute 'gamma'"):
        LinearScheduler(s, "gamma", 1.0, 2)
    with pytest.raises(ValueError, match="`num_steps` must be a positive int"):
        LinearScheduler(s, "beta", 1.0, 0)
    with pytest.raises(TypeError, match="`final_value` must be a number"):
        LinearScheduler(s, "beta", "1", 3)
    with pytest.raises(ValueError, match="`mode` must be 'multiplicative' or 'additive', got 'power'"):
        StepScheduler(s, "beta", mode="power")
    with pytest.raises(ValueError, match="`n_steps` must be a positive int"):
        StepScheduler(s, "beta", n_steps=0)
    with pytest.raises(ValueError, match="`min_value`=1 is larger than `max_value`=0.5"):
        StepScheduler(s, "beta", min_value=1, max_value=0.5)
    with pytest.raises(TypeError, match="`max_value` must be a number or None"):
        StepScheduler(s, "beta", max_value="1")
    with pytest.raises(TypeError, match="`lambda_fn` must map the step count"):
        LambdaScheduler(s, "beta", 0.5)


def test_the_object_validates_the_values_it_receives():
    s = sampler(beta=0.2)
    scheduler = StepScheduler(s, "beta", gamma=-0.3, mode="additive")
    with pytest.raises(ValueError, match="beta"):
        scheduler.step()
    assert s.beta == 0.2
