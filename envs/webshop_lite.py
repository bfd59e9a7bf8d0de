"""webshop_lite: a self-contained text re-implementation of WebShop (Yao et al. 2022).

A shopper gets an instruction ("i need a t-shirt that is cotton, in red color and in size large, and price lower
than 30.00 dollars") and browses a generated catalogue of 1,125 products (`envs/webshop/catalog.py`) through
four kinds of pages, rendered as text whose elements are joined by " [SEP] ":

    search       WebShop [SEP] Instruction: [SEP] <instruction> [SEP] Search
    results      Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > [SEP] B0K7QX [SEP] <title> [SEP] $12.99 ...
    item         Back to Search [SEP] < Prev [SEP] color [SEP] red [SEP] navy [SEP] ... [SEP] Buy Now
    description / features   Back to Search [SEP] < Prev [SEP] <text>

Actions are `search[query]` (search page only) and `click[value]` with a clickable element of the page,
lower-cased (product ids, option values, `description`, `features`, `< prev`, `next >`, `back to search`,
`buy now`). A model's reply may wrap the action: the text inside `<action>...</action>` is used if present, else
the reply's first non-empty line (see `extract_action`). `buy now` ends the episode with the WebShop reward
(`envs/webshop/engine.py`); success means reward 1.0. Invalid actions get "Invalid action: ..." and reward 0
(−`invalid_penalty`, verl-agent's penalty); the episode ends at `max_steps` (= `max_turns`).

    import envs
    env = envs.make("webshop_lite", split="test", seed=0)
    messages = env.reset()
    result = env.step(env.expert_action())  # the scripted expert solves every goal within the step cap

`envs.base.run_policy` scores a policy over seeds; `envs.base.expert_episode(env)` returns an expert episode as chat
messages. `page_size` (default 10, as in WebShop) shortens result pages for small contexts. `show_actions=True`
ends every observation with the valid actions; `state_key()` (also `info["state_key"]`) names the page state
canonically for GiGPO's anchor groups.
"""

from __future__ import annotations

import re

from envs.base import (
    Env,
    Message,
    StepResult,
    admissible_actions_text,
    extract_action,
)
from envs.webshop.catalog import Goal, Product, catalogue, make_goal, products_by_asin, satisfies
from envs.webshop.engine import score_purchase, search

SYSTEM_PROMPT = (
    "You are shopping on WebShop. Reply with one action: search[query] on the search page, or click[value] "
    "where value is a clickable element of the page (a product id, an option, description, features, < prev, "
    "next >, back to search, buy now). Buy now ends the episode."
)
SEP = " [SEP] "
EXPERT_PAGES = 5  # result pages the expert walks before it searches the goal product's title instead
_ACTION = re.compile(r"(search|click)\s*\[(.*)\]", re.IGNORECASE | re.DOTALL)


class WebShopEnv(Env):
    """One shopping episode; the goal is `make_goal(split, seed)`."""

    name = "webshop_lite"
    max_turns = 15

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        max_steps: int = 15,
        page_size: int = 10,
        show_actions: bool = False,
        invalid_penalty: float = 0.0,
    ):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if invalid_penalty < 0:
            raise ValueError(f"invalid_penalty must be >= 0, got {invalid_penalty}")
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if page_size < 2:  # the expert's title search needs its product within the first two results
            raise ValueError(f"page_size must be >= 2, got {page_size}")
        self.split, self.seed, self.max_turns, self.page_size = split, seed, max_steps, page_size
        self.show_actions, self.invalid_penalty = show_actions, float(invalid_penalty)
        self.goal: Goal = make_goal(split, seed)
        self.reset()

    # ------------------------------------------------------------------------------------------------ episode

    def reset(self) -> list[Message]:
        self.page = "search"  # "search" | "results" | "item" | "description" | "features"
        self.results: list[int] = []  # catalogue indices of the last search, best first
        self.page_no = 0
        self.item: Product | None = None
        self.chosen: dict[str, str] = {}  # option axis -> clicked value, for the current item
        self.queries: list[str] = []
        self.steps, self.done = 0, False
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self._observe(self.render())},
        ]

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult([], 0.0, True, {"success": False, "won": False, "error": "episode is over"})
        self.steps += 1
        error = self._apply(extract_action(action if isinstance(action, str) else ""))
        info = {"valid": error is None, "page": self.page, "steps": self.steps, "truncated": False}
        info["state_key"] = self.state_key()
        if self.done:  # bought something
            reward, details = score_purchase(self.goal, self.item, self.chosen)
            success = reward >= 1.0 - 1e-9
            text = f"Thank you for shopping with us!{SEP}Your score (min 0.0, max 1.0){SEP}{reward:.2f}"
            info |= details | {"purchased": self.item.asin, "options": dict(self.chosen), "observation": text}
            return StepResult([], reward, True, info | {"success": success, "won": success})
        text = error if error is not None else self.render()
        info |= {"success": False, "won": False, "observation": text}
        reward = 0.0 if error is None else -self.invalid_penalty  # verl-agent's invalid-action penalty
        if self.steps >= self.max_turns:
            self.done = True
            return StepResult([], reward, True, info | {"truncated": True})
        return StepResult([{"role": "user", "content": self._observe(text)}], reward, False, info)

    def _observe(self, text: str) -> str:
        """An observation, ending with the valid actions when `show_actions` is on (text only)."""
        return text + admissible_actions_text(self.available_actions()) if self.show_actions else text

    def state_key(self) -> tuple:
        """The page and what it shows: the query and result page, or the product and its chosen options."""
        query = self.queries[-1] if self.page != "search" and self.queries else None
        item = self.item.asin if self.item is not None else None
        return (self.page, query, self.page_no, item, tuple(sorted(self.chosen.items())))

    def _apply(self, text: str) -> str | None:
        """Carry out one action; return an "Invalid action: ..." message, or None when it was valid."""
        match = _ACTION.fullmatch(text.strip())
        if match is None:
            return "Invalid action: reply with search[query] or click[value]."
        kind, arg = match.group(1).lower(), " ".join(match.group(2).split())
        if kind == "search":
            if self.page != "search":
                return "Invalid action: no search bar on this page; click[back to search] first."
            if not arg:
                return "Invalid action: the search query is empty."
            self.queries.append(arg)
            self.results, self.page_no, self.page = search(arg), 0, "results"
            return None
        value = arg.lower()
        if value not in self.clickables():
            return f"Invalid action: {value!r} is not clickable on this page."
        self._click(value)
        return None

    def _click(self, value: str) -> None:
        if value == "back to search":
            self.page, self.results, self.item, self.chosen = "search", [], None, {}
        elif self.page == "results":
            if value == "next >":
                self.page_no += 1
            elif value == "< prev":
                self.page_no -= 1
            else:
                self.item, self.chosen, self.page = products_by_asin()[value], {}, "item"
        elif self.page == "item":
            if value == "< prev":
                self.page, self.item, self.chosen = "results", None, {}
            elif value in ("description", "features"):
                self.page = value
            elif value == "buy now":
                self.done = True
            else:
                axis = next(a for a, values in self.item.options.items() if value in values)
                self.chosen[axis] = value
        elif value == "< prev":  # description / features page
            self.page = "item"

    # ------------------------------------------------------------------------------------------------ pages

    def _page_items(self) -> list[Product]:
        start = self.page_no * self.page_size
        return [catalogue()[i] for i in self.results[start : start + self.page_size]]

    def _has_next(self) -> bool:
        return (self.page_no + 1) * self.page_size < len(self.results)

    def render(self) -> str:
        """The current page as text."""
        if self.page == "search":
            return SEP.join(["WebShop", "Instruction:", self.goal.instruction, "Search"])
        if self.page == "results":
            parts = ["Back to Search", f"Page {self.page_no + 1} (Total results: {len(self.results)})"]
            parts += ["< Prev"] * (self.page_no > 0) + ["Next >"] * self._has_next()
            for p in self._page_items():
                parts += [p.asin, p.title, f"${p.price:.2f}"]
            return SEP.join(parts)
        p = self.item
        if self.page == "description":
            return SEP.join(["Back to Search", "< Prev", p.description])
        if self.page == "features":
            return SEP.join(["Back to Search", "< Prev", *p.features])
        parts = ["Back to Search", "< Prev"]
        for axis, values in p.options.items():
            parts += [axis, *values]
        parts += [p.title, f"Price: ${p.price:.2f}", "Description", "Features", "Buy Now"]
        if self.chosen:  # the HTML page highlights chosen options; text needs to say so
            parts.append("Selected: " + ", ".join(self.chosen.values()))
        return SEP.join(parts)

    def clickables(self) -> list[str]:
        """Lower-cased values `click[...]` accepts on the current page."""
        if self.page == "search":
            return []
        if self.page == "results":
            nav = ["< prev"] * (self.page_no > 0) + ["next >"] * self._has_next()
            return ["back to search", *nav, *(p.asin.lower() for p in self._page_items())]
        if self.page in ("description", "features"):
            return ["back to search", "< prev"]
        values = [v for vs in self.item.options.values() for v in vs]
        return ["back to search", "< prev", *values, "description", "features", "buy now"]

    def action_choices(self) -> list[str] | None:
        """`available_actions()`, for constrained sampling; None once the episode is over."""
        return self.available_actions() or None

    def available_actions(self) -> list[str]:
        """Valid actions now. On the search page any search[...] is valid; the one listed searches the
        instruction (without its price clause)."""
        if self.done:
            return []
        if self.page == "search":
            return [f"search[{self.goal.query}]"]
        return [f"click[{v}]" for v in self.clickables()]

    # ------------------------------------------------------------------------------------------------ expert

    def expert_action(self) -> str:
        """The scripted expert's next action: search the instruction, walk up to 5 result pages to the first
        product that satisfies the goal, pick the goal's options, buy. If those pages hold no such product it
        searches the goal product's title instead (which ranks it first or second). At most 11 steps."""
        goal = self.goal
        if self.page == "search":
            if goal.query not in self.queries:
                return f"search[{goal.query}]"
            return f"search[{products_by_asin()[goal.asin.lower()].title.lower()}]"
        if self.page == "results":
            for p in self._page_items():
                if satisfies(goal, p):
                    return f"click[{p.asin.lower()}]"
            more = self._has_next() and self.page_no + 1 < EXPERT_PAGES
            return "click[next >]" if more else "click[back to search]"
        if self.page != "item":
            return "click[< prev]"
        if not satisfies(goal, self.item):
            return "click[< prev]"
        for axis, value in goal.options.items():
            if self.chosen.get(axis) != value:
                return f"click[{value}]"
        return "click[buy now]"
