"""alfworld_lite: layouts, the six task types, state rules, invalid commands, expert vs random."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

import envs
from envs.alfworld.world import LAMP, OPENABLE, TASK_TYPES, kind, make_layout, task_split
from envs.alfworld_lite import NOTHING, AlfWorldEnv, extract_action, normalize
from envs.base import expert_episode, run_policy

SEEDS = range(100)


def _find(split: str, pred, limit: int = 500) -> AlfWorldEnv:
    """The first env of `split` whose layout satisfies `pred`."""
    for seed in range(limit):
        env = AlfWorldEnv(split=split, seed=seed)
        if pred(env):
            return env
    raise AssertionError("no such layout")


def _obs(result) -> str:
    return result.info["observation"]


# ---------------------------------------------------------------------------------------------- layouts


def test_layouts_are_deterministic_split_disjoint_and_cover_all_task_types():
    tasks = {}
    for split in ("train", "test"):
        layouts = [make_layout(split, s) for s in range(200)]
        assert layouts[:5] == [make_layout(split, s) for s in range(5)]
        assert {lay.task.type for lay in layouts} == set(TASK_TYPES)
        for lay in layouts:
            assert task_split(lay.task) == split
            assert 6 <= len(lay.receptacles) <= 10
            objs = [o for r in lay.receptacles for o in lay.contents[r]]
            assert len(objs) == len(set(objs))  # every object is in exactly one place
            if lay.task.target is not None:  # wanted objects never start where they must go
                targets = [r for r in lay.receptacles if kind(r) == lay.task.target]
                assert not any(kind(o) == lay.task.obj for r in targets for o in lay.contents[r])
            wanted = [o for o in objs if kind(o) == lay.task.obj]
            assert len(wanted) >= lay.task.count
        tasks[split] = {(lay.task.type, lay.task.obj, lay.task.target) for lay in layouts}
    assert not tasks["train"] & tasks["test"]


@pytest.mark.parametrize("test_set", ["unseen", "seen"])
def test_the_validation_split_holds_the_test_kinds_in_households_of_its_own(test_set):
    """`--eval.split validation`: the test split's task kinds (unseen, or seen), none of its households."""

    def episodes(split):
        return [envs.make("alfworld_lite", split, s, test_set=test_set).layout for s in range(150)]

    train, val, test = episodes("train"), episodes("validation"), episodes("test")
    kinds = {split: {task_split(lay.task) for lay in lays} for split, lays in (("val", val), ("test", test))}
    assert kinds["val"] == kinds["test"] == {"test" if test_set == "unseen" else "train"}
    assert not {repr(lay) for lay in val} & {repr(lay) for lay in test + train}
    assert len({(lay.task.type, lay.task.obj) for lay in val}) > 10
    with pytest.raises(ValueError, match="split must be one of train, validation, test"):
        envs.make("alfworld_lite", "valid", 0)


def test_reset_reads_like_alfworld_and_make_passes_kwargs():
    env = envs.make("alfworld_lite", split="test", seed=4)
    assert isinstance(env, AlfWorldEnv) and env.max_turns == 30
    messages = env.reset()
    assert [m["role"] for m in messages] == ["system", "user"]
    intro = messages[1]["content"]
    assert intro.startswith("You are in the middle of a room. Looking quickly around you, you see a ")
    assert intro.endswith(f"\n\nYour task is to: {env.task.text}")
    assert all(f"a {r}" in intro for r in env.layout.receptacles)
    small = envs.make("alfworld_lite", split="train", seed=4, max_steps=12, n_receptacles=(4, 5))
    assert small.max_turns == 12 and 4 <= len(small.layout.receptacles) <= 5


def test_extract_and_normalize():
    assert extract_action("go to fridge 1") == "go to fridge 1"
    assert extract_action("Think first.\n<action>open fridge 1</action>") == "open fridge 1"
    assert extract_action("take apple 1 from countertop 1\nthen heat it") == "take apple 1 from countertop 1"
    assert normalize("  Go to   Fridge 1. ") == "go to fridge 1"


# ---------------------------------------------------------------------------------------------- rules


def test_take_moves_the_object_into_the_inventory_and_move_puts_it_back():
    def takeable(e: AlfWorldEnv, r: str) -> bool:
        return kind(r) not in OPENABLE and any(o != LAMP for o in e.contents[r])

    env = _find("train", lambda e: any(takeable(e, r) for r in e.contents))
    r = next(r for r in env.layout.receptacles if takeable(env, r))
    obj = next(o for o in env.contents[r] if o != LAMP)
    assert f"On the {r}, you see" in _obs(env.step(f"go to {r}")) and obj in _obs(env.step(f"examine {r}"))
    assert _obs(env.step(f"take {obj} from {r}")) == f"You pick up the {obj} from the {r}."
    assert env.inventory == [obj] and obj not in env.contents[r]
    assert _obs(env.step("inventory")) == f"You are carrying: a {obj}."
    assert obj not in _obs(env.step(f"examine {r}"))
    other = next((o for o in env.contents[r] if o != LAMP), None)
    if other is not None:  # one object at a time
        assert _obs(env.step(f"take {other} from {r}")) == NOTHING
    assert _obs(env.step(f"put {obj} on {r}")) == f"You move the {obj} to the {r}."  # the old grammar works too
    assert env.inventory == [] and obj in env.contents[r]
    assert _obs(env.step("inventory")) == "You are not carrying anything."


def test_closed_receptacles_hide_their_contents():
    env = _find("train", lambda e: any(e.layout.contents[r] and kind(r) in OPENABLE for r in e.contents))
    r = next(r for r in env.layout.receptacles if env.contents[r] and kind(r) in OPENABLE)
    obj = env.contents[r][0]
    arrive = _obs(env.step(f"go to {r}"))
    assert arrive == f"You arrive at {r}. The {r} is closed." and obj not in arrive
    assert f"take {obj} from {r}" not in env.available_actions()
    assert _obs(env.step(f"take {obj} from {r}")) == NOTHING and env.inventory == []
    opened = _obs(env.step(f"open {r}"))
    assert opened.startswith(f"You open the {r}. The {r} is open. In it, you see") and obj in opened
    assert _obs(env.step(f"open {r}")) == NOTHING  # already open
    assert _obs(env.step(f"close {r}")) == f"You close the {r}."
    assert _obs(env.step(f"examine {r}")) == f"The {r} is closed."
    assert _obs(env.step(f"take {obj} from {r}")) == NOTHING and obj in env.contents[r]


def test_heating_needs_the_microwave_and_the_goal_pays_once():
    env = _find("test", lambda e: e.task.type == "pick_heat_then_place")
    trace = []
    while not env.done:
        action = env.expert_action()
        if action.startswith("heat "):  # heating elsewhere does nothing
            held = env.inventory[0]
            elsewhere = copy.deepcopy(env)
            other = next(r for r in elsewhere.contents if kind(r) != "microwave")
            elsewhere.step(f"go to {other}")
            assert _obs(elsewhere.step(f"heat {held} with {other}")) == NOTHING
        trace.append(env.step(action))
    assert [t.reward for t in trace] == [0.0] * (len(trace) - 1) + [1.0]
    assert trace[-1].info["won"] and trace[-1].info["success"] and trace[-1].observations == []
    assert any(o.startswith("You heat the") for o in map(_obs, trace))


def test_look_at_obj_in_light_needs_the_object_in_hand_by_the_lit_lamp():
    env = _find("train", lambda e: e.task.type == "look_at_obj_in_light")
    holder = next(r for r in env.contents if LAMP in env.contents[r])
    env.step(f"go to {holder}")
    r = env.step(f"use {LAMP}")
    assert _obs(r) == f"You turn on the {LAMP}." and not r.done  # lamp on, but nothing in hand
    while not env.done:
        r = env.step(env.expert_action())
    assert r.info["won"] and any(kind(o) == env.task.obj for o in env.inventory)


def test_invalid_commands_say_nothing_happens_until_the_cap():
    env = AlfWorldEnv(split="train", seed=3, max_steps=8)
    bad = ["fly to the moon", "", None, "go to nowhere 1", "take apple 9 from fridge 1", "use desklamp 1"]
    for action in [*bad, "open countertop 1"]:
        r = env.step(action)
        assert _obs(r) == NOTHING and r.observations[0]["content"] == NOTHING
        assert r.reward == 0.0 and not r.done and not r.info["valid"]
    r = env.step("look")
    assert r.done and r.info["truncated"] and r.reward == 0.0 and not r.info["won"]
    assert env.step("look").done  # a finished episode neither raises nor pays


def test_available_actions_are_all_valid():
    rng = random.Random(0)
    for seed in range(5):
        env = AlfWorldEnv(split="test", seed=seed, max_steps=100)
        for _ in range(15):
            actions = env.available_actions()
            for a in actions:
                assert copy.deepcopy(env).step(a).info["valid"], a
            env.step(rng.choice(actions))
            if env.done:
                break


# ---------------------------------------------------------------------------------------------- policies


@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_every_task(split):
    for seed in SEEDS:
        env = AlfWorldEnv(split=split, seed=seed)
        r = None
        while r is None or not r.done:
            r = env.step(env.expert_action())
            assert r.info["valid"], (seed, r.info)
        assert r.info["won"] and r.reward == 1.0, seed
        assert env.steps <= 2 * len(env.layout.receptacles) + 6  # the bound max_steps is set from


def test_expert_recovers_after_a_random_prefix():
    rng = random.Random(2)
    for seed in range(30):
        env = AlfWorldEnv(split="train", seed=seed, max_steps=60)
        for _ in range(6):
            env.step(rng.choice(env.available_actions()))
        r = None if not env.done else env.step("look")
        while r is None or not r.done:
            r = env.step(env.expert_action())
        assert r.info["won"], seed


def test_random_valid_policy_is_far_below_the_expert():
    rng = random.Random(0)
    test = lambda seed: AlfWorldEnv(split="test", seed=seed)  # noqa: E731
    expert = run_policy(test, lambda env: env.expert_action(), SEEDS)
    rand = run_policy(test, lambda env: rng.choice(env.available_actions()), SEEDS)
    assert expert["success_rate"] == 1.0 and expert["mean_reward"] == 1.0 and expert["episodes"] == 100
    assert rand["success_rate"] <= 0.1 and rand["mean_reward"] <= 0.1


def test_expert_demo_and_pickling():
    demo = expert_episode(AlfWorldEnv(split="test", seed=0))
    assert [m["role"] for m in demo[:4]] == ["system", "user", "assistant", "user"]
    assert demo[-1]["role"] == "assistant" and all(m["content"] for m in demo)
    env = AlfWorldEnv(split="test", seed=0)
    env.step(demo[2]["content"])
    clone = pickle.loads(pickle.dumps(env))  # env pools may ship envs to worker processes
    assert clone.available_actions() == env.available_actions() and clone.expert_action() == env.expert_action()


def test_show_actions_lists_admissible_commands_and_changes_nothing_else():
    plain, shown = AlfWorldEnv("test", 3), AlfWorldEnv("test", 3, show_actions=True)
    a, b = plain.reset(), shown.reset()
    assert b[1]["content"].startswith(a[1]["content"])
    assert b[1]["content"].endswith("[" + " | ".join(shown.available_actions()) + "]")
    while not plain.done:
        action = plain.expert_action()
        r1, r2 = plain.step(action), shown.step(action)
        assert (r1.reward, r1.done, r1.info["state_key"]) == (r2.reward, r2.done, r2.info["state_key"])
        if not r1.done:
            assert r2.observations[0]["content"].startswith(r1.observations[0]["content"])
            assert " | ".join(shown.available_actions()) in r2.observations[0]["content"]
    assert plain.won and shown.won


def test_state_key_is_the_state_not_the_path():
    env = AlfWorldEnv("test", 0)
    r1, r2 = [c.removeprefix("go to ") for c in env.available_actions()[:2]]

    def key_after(commands: list[str]):
        env.reset()
        for c in commands:
            env.step(c)
        return env.state_key()

    same = key_after([f"go to {r1}", f"go to {r2}", f"go to {r1}"])
    assert same == key_after([f"go to {r2}", f"go to {r1}"])  # both: at r1, having seen r1 and r2
    assert same == key_after([f"go to {r2}", f"go to {r1}", "look", "inventory"])  # no-op commands
    assert key_after([f"go to {r1}"]) != key_after([f"go to {r2}"])
    assert key_after([f"go to {r1}"]) != same  # same place, but r2 not seen yet
    hash(same)


def test_invalid_penalty_costs_only_commands_that_do_nothing():
    """verl-agent's invalid-action penalty: each command that does nothing costs `invalid_penalty`; valid commands
    and the winning one pay as before, and success is unchanged."""
    plain, fined = AlfWorldEnv("train", 5), AlfWorldEnv("train", 5, invalid_penalty=0.1)
    assert fined.step("fly to the moon").reward == pytest.approx(-0.1)
    assert plain.step("fly to the moon").reward == 0.0
    for env in (plain, fined):
        env.reset()
    total = {id(plain): 0.0, id(fined): 0.0}
    while not plain.done:
        a = plain.expert_action()
        for env in (plain, fined):
            r = env.step(a)
            total[id(env)] += r.reward
            assert r.info["valid"]
    assert plain.won and fined.won and total[id(plain)] == total[id(fined)] == 1.0
    with pytest.raises(ValueError, match="invalid_penalty"):
        AlfWorldEnv("train", 5, invalid_penalty=-1)
    assert envs.make("alfworld_lite", "train", 5, invalid_penalty=0.25).step("xyzzy").reward == -0.25


@pytest.mark.parametrize("ttype", TASK_TYPES)
def test_progress_reward_pays_each_subgoal_once_and_keeps_success(ttype):
    """`progress_reward`: the expert's episode earns p per subgoal of its task (hold; the state where one is asked
    for; each object placed; by the lamp), each once, plus 1 for success, while the unshaped env pays as before;
    undoing and redoing a subgoal pays nothing more."""
    env = _find("train", lambda e: e.task.type == ttype)
    shaped = AlfWorldEnv("train", env.seed, progress_reward=0.2)
    t = shaped.task
    want = {"hold"} | ({"state"} if t.state else set()) | ({"lamp"} if t.target is None else set())
    want |= {f"placed {k}" for k in range(1, t.count + 1)} if t.target else set()
    rewards = []
    while not shaped.done:
        a = shaped.expert_action()
        assert env.step(a).reward == (1.0 if env.won else 0.0)  # unshaped: unchanged
        rewards.append(shaped.step(a).reward)
    assert shaped.won and shaped.reached == want
    assert sum(rewards) == pytest.approx(1.0 + 0.2 * len(want))
    assert rewards[-1] >= 1.0 and all(r in (0.0, 0.2, 0.4) for r in rewards[:-1])
    # farming: take the object, put it back, take it again: "hold" paid on the first take only
    farm = AlfWorldEnv("train", env.seed, progress_reward=0.2)
    while "hold" not in farm.reached:
        farm.step(farm.expert_action())
    obj, loc = farm.inventory[0], farm.location
    assert farm.step(f"move {obj} to {loc}").reward == 0.0 and not farm.inventory
    assert farm.step(f"take {obj} from {loc}").reward == 0.0 and farm.inventory == [obj]


def test_seen_test_set_holds_train_task_kinds_in_new_households():
    """test_set="seen" (ALFWorld's valid_seen): the test split's episodes have the train split's task kinds, but
    households never drawn for training; the default stays the unseen kinds."""
    seen = [AlfWorldEnv("test", s, test_set="seen").layout for s in range(100)]
    train = [make_layout("train", s) for s in range(2000)]
    kinds = {(lay.task.type, lay.task.obj, lay.task.target) for lay in train}
    assert all(task_split(lay.task) == "train" for lay in seen)
    assert sum((lay.task.type, lay.task.obj, lay.task.target) in kinds for lay in seen) >= 70  # 79 of 100
    assert not {repr(lay) for lay in seen} & {repr(lay) for lay in train}
    assert AlfWorldEnv("test", 3).layout == make_layout("test", 3)  # unseen by default
    assert AlfWorldEnv("train", 3, test_set="seen").layout == make_layout("train", 3)  # train ignores it
    with pytest.raises(ValueError, match="test_set"):
        AlfWorldEnv("test", 0, test_set="valid")
    with pytest.raises(ValueError, match="split"):
        make_layout("valid", 0)


def test_progress_reward_validated():
    with pytest.raises(ValueError, match="progress_reward"):
        AlfWorldEnv("train", 0, progress_reward=-0.1)
    assert envs.make("alfworld_lite", "train", 0, progress_reward=0.1).progress_reward == 0.1
