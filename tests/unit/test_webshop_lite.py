"""webshop_lite: catalogue, retrieval, the WebShop reward, page navigation, invalid actions, expert vs random."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

import envs
from envs.base import expert_episode, run_policy
from envs.webshop.catalog import Goal, Product, catalogue, goal_split, make_goal, satisfies
from envs.webshop.engine import score_purchase, search
from envs.webshop_lite import SEP, WebShopEnv, extract_action

SEEDS = range(100)


def _run(env: WebShopEnv, actions: list[str]):
    result = None
    for a in actions:
        result = env.step(a)
    return result


# ---------------------------------------------------------------------------------------------- catalogue


def test_catalogue_is_large_varied_and_unique():
    products = catalogue()
    assert len(products) >= 1000
    assert len({p.category for p in products}) >= 5
    assert len({p.asin for p in products}) == len(products)
    assert len({p.title for p in products}) == len(products)
    for p in products[::97]:
        assert p.attributes and p.options and p.price > 0 and p.description and p.features


def test_goals_are_deterministic_satisfiable_and_split_disjoint():
    keys = {}
    for split in ("train", "test"):
        goals = [make_goal(split, s) for s in range(200)]
        assert goals[:5] == [make_goal(split, s) for s in range(5)]
        for g in goals:
            assert goal_split(g) == split
            assert satisfies(g, next(p for p in catalogue() if p.asin == g.asin))
            assert f"{g.price_bound:.2f} dollars" in g.instruction
        keys[split] = {(g.type, frozenset(g.attributes), frozenset(g.options.items())) for g in goals}
    assert not keys["train"] & keys["test"]
    assert len(keys["test"]) > 150  # varied, not a handful of repeated goals


def test_search_ranks_by_relevance_and_every_title_lands_on_page_one():
    # the expert's fallback relies on this: searching a product's exact title shows it among the first 10
    for i, p in enumerate(catalogue()):
        assert i in search(p.title.lower())[:10]
    top = [catalogue()[i] for i in search("gluten free snack bars")[:10]]
    assert all(p.type == "snack bars" for p in top)
    assert search("qwertyuiop") == []


# ---------------------------------------------------------------------------------------------- reward


def _product(**kw) -> Product:
    base = dict(
        asin="B0TEST",
        title="Test Cotton Slim Fit T-shirt",
        category="fashion",
        type="t-shirt",
        attributes=("cotton", "slim fit", "machine wash"),
        options={"color": ("red", "navy"), "size": ("small", "large")},
        price=20.0,
        description="d",
        features=("f",),
    )
    return Product(**(base | kw))


GOAL = Goal(
    instruction="i need a t-shirt that is cotton and slim fit, in red color and in size large, and price lower "
    "than 30.00 dollars",
    query="",
    category="fashion",
    type="t-shirt",
    attributes=("cotton", "slim fit"),
    options={"color": "red", "size": "large"},
    price_bound=30.0,
    asin="B0TEST",
)
RIGHT = {"color": "red", "size": "large"}


@pytest.mark.parametrize(
    "product_kw, chosen, expected",
    [
        ({}, RIGHT, 1.0),  # everything matches
        ({}, {"color": "red"}, 4 / 5),  # size not chosen
        ({}, {"color": "navy", "size": "small"}, 3 / 5),  # both options wrong
        ({"attributes": ("cotton", "machine wash")}, RIGHT, 4 / 5),  # one attribute missing
        ({"price": 35.0}, RIGHT, 4 / 5),  # over the price bound
        ({"price": 30.0}, RIGHT, 1.0),  # the bound itself is allowed
        ({"type": "hoodie"}, RIGHT, 0.5),  # same category, other type
        ({"type": "lipstick", "category": "beauty"}, RIGHT, 0.1),  # other category
        ({"type": "hoodie", "attributes": (), "price": 99.0}, {}, 0.0),  # nothing matches
    ],
)
def test_score_purchase_partial_matches(product_kw, chosen, expected):
    reward, details = score_purchase(GOAL, _product(**product_kw), chosen)
    assert reward == pytest.approx(expected)
    assert set(details) == {"matched_attributes", "matched_options", "price_ok", "type_factor"}


# ---------------------------------------------------------------------------------------------- env


def test_reset_and_make():
    env = envs.make("webshop_lite", split="test", seed=3)
    assert isinstance(env, WebShopEnv) and env.max_turns == 15
    messages = env.reset()
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "search[" in messages[0]["content"] and "click[" in messages[0]["content"]
    assert messages[1]["content"] == SEP.join(["WebShop", "Instruction:", env.goal.instruction, "Search"])
    again = envs.make("webshop_lite", split="test", seed=3)
    assert again.goal == env.goal and again.reset() == messages
    assert envs.make("webshop_lite", split="test", seed=3, max_steps=7).max_turns == 7


def test_extract_action():
    assert extract_action("click[buy now]") == "click[buy now]"
    assert extract_action("I will buy it.\n<action> click[buy now] </action>") == "click[buy now]"
    assert extract_action("\n  search[red shirt]\nbecause it is red") == "search[red shirt]"
    assert extract_action("") == ""


def test_navigation_pages_options_and_prev():
    env = WebShopEnv(split="train", seed=5)
    r = env.step(f"search[{env.goal.query}]")
    assert not r.done and r.info["valid"] and env.page == "results"
    text = r.observations[0]["content"]
    assert text.startswith("Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next >")
    assert "< Prev" not in text and text.count("$") == 10
    first_page = env.clickables()
    r = env.step("click[next >]")
    assert "Page 2" in r.observations[0]["content"] and "< prev" in env.clickables()
    assert set(env.clickables()).isdisjoint(a for a in first_page if a.startswith("b0"))
    env.step("Click[< Prev]")  # case-insensitive
    assert env.page_no == 0
    asin = next(a for a in env.clickables() if a.startswith("b0"))
    r = env.step(f"click[{asin.upper()}]")
    item = env.item
    assert env.page == "item" and item.title in r.observations[0]["content"]
    axis, values = next(iter(item.options.items()))
    r = env.step(f"click[{values[-1]}]")
    assert env.chosen == {axis: values[-1]} and r.observations[0]["content"].endswith(f"Selected: {values[-1]}")
    r = env.step("click[description]")
    assert env.page == "description" and item.description in r.observations[0]["content"]
    env.step("click[< prev]")
    assert env.page == "item" and env.chosen == {axis: values[-1]}  # options survive a look at the description
    env.step("click[back to search]")
    assert env.page == "search" and env.item is None and env.chosen == {}


def test_buy_now_ends_with_the_webshop_reward():
    env = WebShopEnv(split="test", seed=11)
    env.step(f"search[{env.goal.query}]")
    asin = next(a for a in env.clickables() if a.startswith("b0"))
    env.step(f"click[{asin}]")
    product = env.item
    r = env.step("click[buy now]")  # no options chosen
    expected, _ = score_purchase(env.goal, product, {})
    assert r.done and r.observations == [] and r.reward == pytest.approx(expected)
    assert r.info["success"] is False and r.info["purchased"] == product.asin
    assert env.step("click[buy now]").done  # stepping a finished episode neither raises nor pays


def test_invalid_actions_keep_the_episode_going_until_the_cap():
    env = WebShopEnv(split="train", seed=2, max_steps=7)
    bad = ["", "buy the red shirt", "click[buy now]", "click[nonexistent]", None]
    for action in bad:
        r = env.step(action)
        assert not r.done and r.reward == 0.0 and not r.info["valid"]
        assert r.observations[0]["content"].startswith("Invalid action")
    env.step("search[shirt]")
    r = env.step("search[another shirt]")  # no search bar on the results page
    assert r.done and r.reward == 0.0 and r.info["truncated"] and not r.info["success"]


def test_available_actions_are_all_valid():
    rng = random.Random(0)
    env = WebShopEnv(split="train", seed=9)
    for _ in range(12):
        actions = env.available_actions()
        assert actions
        for a in actions:
            assert copy.deepcopy(env).step(a).info["valid"], a
        r = env.step(rng.choice([a for a in actions if a != "click[buy now]"]))
        assert not r.done


# ---------------------------------------------------------------------------------------------- policies


@pytest.mark.parametrize("split", ["train", "test"])
def test_expert_solves_every_goal(split):
    for seed in SEEDS:
        env = WebShopEnv(split=split, seed=seed)
        r = None
        while r is None or not r.done:
            r = env.step(env.expert_action())
        assert r.info["success"] and r.reward == 1.0, seed
        assert env.steps <= 11  # search + 4 x next + back + title search + click + 2 options + buy


def test_expert_falls_back_to_the_title_and_recovers_from_detours():
    env = WebShopEnv(split="test", seed=1)
    env.step(f"search[{env.goal.query}]")
    env.step("click[back to search]")
    target = next(p for p in catalogue() if p.asin == env.goal.asin)
    assert env.expert_action() == f"search[{target.title.lower()}]"
    rng = random.Random(1)
    for seed in range(20):  # a random prefix, then the expert takes over
        env = WebShopEnv(split="train", seed=seed, max_steps=30)
        for _ in range(4):
            env.step(rng.choice([a for a in env.available_actions() if a != "click[buy now]"]))
        r = None
        while r is None or not r.done:
            r = env.step(env.expert_action())
        assert r.info["success"], seed


def test_random_valid_policy_is_far_below_the_expert():
    rng = random.Random(0)
    test = lambda seed: WebShopEnv(split="test", seed=seed)  # noqa: E731
    expert = run_policy(test, lambda env: env.expert_action(), SEEDS)
    rand = run_policy(test, lambda env: rng.choice(env.available_actions()), SEEDS)
    assert expert["success_rate"] == 1.0 and expert["mean_reward"] == 1.0 and expert["episodes"] == 100
    assert rand["success_rate"] <= 0.1
    assert rand["mean_reward"] < 0.5


def test_short_pages_expert_demo_and_pickling():
    for seed in range(30):
        env = WebShopEnv(split="test", seed=seed, page_size=3)
        while not env.done:
            r = env.step(env.expert_action())
            assert len(env.clickables()) <= 3 + 3 or env.page != "results"
        assert r.info["success"], seed
    demo = expert_episode(WebShopEnv(split="train", seed=0))
    assert [m["role"] for m in demo[:4]] == ["system", "user", "assistant", "user"]
    assert demo[2]["content"].startswith("search[") and demo[-1] == {
        "role": "assistant",
        "content": "click[buy now]",
    }
    env = WebShopEnv(split="train", seed=0)
    env.step(demo[2]["content"])
    clone = pickle.loads(pickle.dumps(env))  # env pools may ship envs to worker processes
    assert clone.render() == env.render() and clone.expert_action() == env.expert_action()


def test_show_actions_lists_valid_actions_and_changes_nothing_else():
    plain, shown = WebShopEnv("test", 4, page_size=3), WebShopEnv("test", 4, page_size=3, show_actions=True)
    a, b = plain.reset(), shown.reset()
    assert b[1]["content"].startswith(a[1]["content"]) and shown.available_actions()[0] in b[1]["content"]
    while not plain.done:
        action = plain.expert_action()
        r1, r2 = plain.step(action), shown.step(action)
        assert (r1.reward, r1.done, r1.info["state_key"]) == (r2.reward, r2.done, r2.info["state_key"])
        if not r1.done:
            suffix = "[" + " | ".join(shown.available_actions()) + "]"
            obs_plain, obs_shown = r1.observations[0]["content"], r2.observations[0]["content"]
            assert obs_shown.startswith(obs_plain) and obs_shown.endswith(suffix)
    assert plain.done and shown.done


def test_state_key_is_the_page_not_the_path():
    env = WebShopEnv("test", 4, page_size=3)

    def key_after(actions: list[str]):
        env.reset()
        for a in actions:
            assert env.step(a).info["valid"], a
        return env.state_key()

    query = env.goal.query
    results = key_after([f"search[{query}]"])
    first = env.clickables()[-1]  # a product id on the first results page
    assert key_after([f"search[{query}]", f"click[{first}]", "click[< prev]"]) == results
    assert key_after([f"search[{query}]", f"click[{first}]"]) != results
    assert key_after(["search[something else entirely]"]) != results
    assert key_after([]) == key_after([f"search[{query}]", "click[back to search]"])  # the search page


def test_invalid_penalty_costs_only_invalid_actions():
    env = WebShopEnv(split="train", seed=2, max_steps=7, invalid_penalty=0.1)
    r = env.step("click[nonexistent]")
    assert not r.info["valid"] and r.reward == pytest.approx(-0.1)
    r = env.step("search[shirt]")
    assert r.info["valid"] and r.reward == 0.0
    fined, plain = WebShopEnv("test", 4, invalid_penalty=0.1), WebShopEnv("test", 4)
    while not plain.done:  # the expert's episode pays exactly as before
        a = plain.expert_action()
        assert fined.step(a).reward == plain.step(a).reward
    assert fined.done
