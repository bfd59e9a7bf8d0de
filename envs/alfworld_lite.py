"""alfworld_lite: a self-contained text re-implementation of ALFWorld (Shridhar et al. 2021).

Each episode is one generated household (`envs/alfworld/world.py`): a room with 6-10 receptacles, some closed,
objects placed in them, and one task of the six ALFWorld types (pick_and_place, look_at_obj_in_light,
pick_clean_then_place, pick_heat_then_place, pick_cool_then_place, pick_two_obj). Observations and feedback
follow the original:

    You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 1, ...
    Your task is to: put a hot apple in countertop.
    > go to fridge 1        You arrive at fridge 1. The fridge 1 is closed.
    > open fridge 1         You open the fridge 1. The fridge 1 is open. In it, you see a apple 1.

Commands: go to {recep}, open/close {recep}, take {obj} from {recep}, move {obj} to {recep} (also
"put {obj} in/on {recep}"), heat/cool/clean {obj} with {recep}, use {obj}, examine {obj|recep}, inventory, look.
A model's reply may wrap the command: the text inside `<action>...</action>` is used if present, else the reply's
first non-empty line. Anything invalid gets "Nothing happens." and reward 0 (−`invalid_penalty`). Reward 1 and
done when the goal holds (`info["won"]`); the episode also ends at `max_steps` (= `max_turns`).

    import envs
    env = envs.make("alfworld_lite", split="test", seed=0)
    messages = env.reset()
    result = env.step(env.expert_action())  # the scripted expert solves every task within the step cap

The expert explores like a person would (visits receptacles in the listed order, opening closed ones) and only
uses what it has seen, so its demonstrations are learnable (`envs.base.expert_episode(env)` returns one as chat
messages; `envs.base.run_policy` scores a policy over seeds). `n_receptacles=(lo, hi)` sizes the rooms; the default step cap covers the expert.
`invalid_penalty=p` makes a command that does nothing cost p (verl-agent's invalid-action penalty: a dense
signal while successes are rare; success is still `info["won"]`). `progress_reward=p` pays p the first time each
subgoal of the task is reached in an episode (`subgoals()`: an object of the task's type in hand; that object hot,
cool or clean where the task asks for it; each object placed; for look_at_obj_in_light, standing by the lamp with
it): a failed episode that got further earns more, so a group of failures still ranks its episodes, and the
anchor states of GiGPO see different returns. It cannot be farmed (each subgoal pays once) and success stays
`info["won"]`. `test_set="seen"` makes the test split ALFWorld's in-distribution held-out set (the train split's
task kinds in households never drawn for training) instead of the unseen task kinds ("unseen", the default); the
validation split holds the test split's kinds in households of its own (for choosing the lr and the steps).
`show_actions=True` ends every observation with the admissible commands (`available_actions()`); `state_key()`
(also `info["state_key"]`) names the state canonically for GiGPO's anchor groups.
"""

from __future__ import annotations

import re

from envs.alfworld.world import APPLIANCE, LAMP, OPENABLE, STATE, VERB, Layout, kind, make_layout
from envs.base import (
    Env,
    Message,
    StepResult,
    admissible_actions_text,
    extract_action,
)

SYSTEM_PROMPT = (
    "You are in a household. Reply with one command: go to X, open X, close X, take O from X, move O to X, "
    "heat O with X, cool O with X, clean O with X, use O, examine X, inventory, look."
)
NOTHING = "Nothing happens."
_PATTERNS = [
    ("go", re.compile(r"go to (.+)")),
    ("open", re.compile(r"open (.+)")),
    ("close", re.compile(r"close (.+)")),
    ("take", re.compile(r"take (.+) from (.+)")),
    ("move", re.compile(r"move (.+) to (.+)")),
    ("move", re.compile(r"put (.+) (?:in|on|in/on) (.+)")),
    ("apply", re.compile(r"(heat|cool|clean) (.+) with (.+)")),
    ("use", re.compile(r"use (.+)")),
    ("examine", re.compile(r"examine (.+)")),
    ("inventory", re.compile(r"inventory")),
    ("look", re.compile(r"look")),
]


def normalize(command: str) -> str:
    """Lower-case, single spaces, no trailing period: "Go to  Fridge 1." -> "go to fridge 1"."""
    return " ".join(command.lower().split()).rstrip(".").strip()


def _listing(items: list[str]) -> str:
    """ALFWorld's lists: "a apple 1", "a apple 1, and a mug 2", "a x, a y, and a z"."""
    items = [f"a {i}" for i in items]
    if not items:
        return "nothing"
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + ", and " + items[-1]


class AlfWorldEnv(Env):
    """One household task; the layout is `make_layout(split, seed, n_receptacles)`."""

    name = "alfworld_lite"
    max_turns = 30
    splits = ("train", "validation", "test")

    def __init__(
        self,
        split: str = "train",
        seed: int = 0,
        max_steps: int | None = None,
        n_receptacles: tuple[int, int] = (6, 10),
        show_actions: bool = False,
        invalid_penalty: float = 0.0,
        progress_reward: float = 0.0,
        test_set: str = "unseen",
    ):
        if split not in self.splits:
            raise ValueError(f"split must be one of {', '.join(self.splits)}, got {split!r}")
        if test_set not in ("unseen", "seen"):
            raise ValueError(f"test_set must be 'unseen' or 'seen', got {test_set!r}")
        if invalid_penalty < 0:
            raise ValueError(f"invalid_penalty must be >= 0, got {invalid_penalty}")
        if progress_reward < 0:
            raise ValueError(f"progress_reward must be >= 0, got {progress_reward}")
        if not 3 <= n_receptacles[0] <= n_receptacles[1]:
            raise ValueError(f"n_receptacles must be (lo, hi) with 3 <= lo <= hi, got {n_receptacles}")
        # the expert needs at most 2 * (receptacles) + 6 steps (visit + open each one, then carry two objects)
        max_steps = max(30, 2 * n_receptacles[1] + 6) if max_steps is None else max_steps
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        self.split, self.seed, self.max_turns, self.show_actions = split, seed, max_steps, show_actions
        self.invalid_penalty, self.progress_reward = float(invalid_penalty), float(progress_reward)
        # validation: the test split's kinds (unseen or seen) in households of their own
        where = {"train": "train", "test": "test", "validation": "validation"}[split]
        if split != "train" and test_set == "seen":
            where = {"test": "seen", "validation": "validation_seen"}[split]
        self.layout: Layout = make_layout(where, seed, tuple(n_receptacles))
        self.task = self.layout.task
        self.reset()

    # ------------------------------------------------------------------------------------------------ episode

    def reset(self) -> list[Message]:
        self.contents = {r: list(objs) for r, objs in self.layout.contents.items()}
        self.closed = {r for r in self.layout.receptacles if kind(r) in OPENABLE}
        self.location: str | None = None  # None = the middle of the room
        self.inventory: list[str] = []  # ALFWorld agents carry one object at a time
        self.states: dict[str, set[str]] = {}  # object -> {"hot", "cool", "clean"}
        self.lamp_on = False
        self.observed: set[str] = set()  # receptacles whose contents have been shown
        self.steps, self.done, self.won = 0, False, False
        self.reached: set[str] = set()  # subgoals reached so far (each pays progress_reward once)
        intro = (
            "You are in the middle of a room. Looking quickly around you, you see "
            f"{_listing(list(self.layout.receptacles))}.\n\nYour task is to: {self.task.text}"
        )
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": self._observe(intro)},
        ]

    def step(self, action: str) -> StepResult:
        if self.done:
            return StepResult([], 0.0, True, {"success": self.won, "won": self.won, "error": "episode is over"})
        self.steps += 1
        feedback = self._execute(normalize(extract_action(action if isinstance(action, str) else "")))
        self.won = self._goal_met()
        info = {
            "valid": feedback is not None,
            "observation": feedback or NOTHING,
            "steps": self.steps,
            "task": self.task.text,
            "task_type": self.task.type,
            "success": self.won,
            "won": self.won,
            "truncated": not self.won and self.steps >= self.max_turns,
            "state_key": self.state_key(),
        }
        new = self.subgoals() - self.reached
        self.reached |= new
        info["subgoals"] = len(self.reached)
        fine = 0.0 if info["valid"] else self.invalid_penalty
        reward = float(self.won) + self.progress_reward * len(new) - fine
        if self.won or info["truncated"]:
            self.done = True
            return StepResult([], reward, True, info)
        return StepResult([{"role": "user", "content": self._observe(info["observation"])}], reward, False, info)

    def _observe(self, text: str) -> str:
        """An observation, ending with the admissible actions when `show_actions` is on (text only: the rules and
        rewards are the same either way)."""
        return text + admissible_actions_text(self.available_actions()) if self.show_actions else text

    def state_key(self) -> tuple:
        """Location, inventory, open receptacles, the contents of every receptacle seen, object states, lamp."""
        return (
            self.location,
            tuple(self.inventory),
            tuple(sorted(self.closed)),
            tuple((r, tuple(sorted(self.contents[r]))) for r in sorted(self.observed)),
            tuple(sorted((o, tuple(sorted(st))) for o, st in self.states.items())),
            self.lamp_on,
        )

    # ------------------------------------------------------------------------------------------------ rules

    def _visible(self) -> list[str]:
        """Objects at the current receptacle the agent can see (none inside a closed one)."""
        loc = self.location
        return [] if loc is None or loc in self.closed else list(self.contents[loc])

    def _describe(self, r: str) -> str:
        if r in self.closed:
            return f"The {r} is closed."
        self.observed.add(r)
        if kind(r) in OPENABLE:
            return f"The {r} is open. In it, you see {_listing(self.contents[r])}."
        return f"On the {r}, you see {_listing(self.contents[r])}."

    def _execute(self, command: str) -> str | None:
        """Apply one normalised command; the feedback text, or None when nothing happens."""
        for name, pattern in _PATTERNS:
            if match := pattern.fullmatch(command):
                return getattr(self, f"_do_{name}")(*match.groups())
        return None

    def _do_go(self, r: str) -> str | None:
        if r not in self.contents or r == self.location:
            return None
        self.location = r
        return f"You arrive at {r}. {self._describe(r)}"

    def _do_open(self, r: str) -> str | None:
        if r != self.location or r not in self.closed:
            return None
        self.closed.discard(r)
        return f"You open the {r}. {self._describe(r)}"

    def _do_close(self, r: str) -> str | None:
        if r != self.location or kind(r) not in OPENABLE or r in self.closed:
            return None
        self.closed.add(r)
        return f"You close the {r}."

    def _do_take(self, obj: str, r: str) -> str | None:
        if r != self.location or obj not in self._visible() or obj == LAMP or self.inventory:
            return None
        self.contents[r].remove(obj)
        self.inventory.append(obj)
        return f"You pick up the {obj} from the {r}."

    def _do_move(self, obj: str, r: str) -> str | None:
        if obj not in self.inventory or r != self.location or r in self.closed:
            return None
        self.inventory.remove(obj)
        self.contents[r].append(obj)
        return f"You move the {obj} to the {r}."

    def _do_apply(self, verb: str, obj: str, r: str) -> str | None:
        if obj not in self.inventory or r != self.location or VERB.get(kind(r)) != verb:
            return None
        states = self.states.setdefault(obj, set())
        states -= {"hot", "cool"} if verb != "clean" else set()  # heating undoes cooling and vice versa
        states.add(STATE[verb])
        return f"You {verb} the {obj} using the {r}."

    def _do_use(self, obj: str) -> str | None:
        if obj != LAMP or obj not in self._visible() or self.lamp_on:
            return None
        self.lamp_on = True
        return f"You turn on the {obj}."

    def _do_examine(self, name: str) -> str | None:
        if name == self.location:
            return self._describe(name)
        if name in self.inventory or name in self._visible():
            return f"There's nothing special about {name}."
        return None

    def _do_inventory(self) -> str:
        return f"You are carrying: {_listing(self.inventory)}." if self.inventory else "You are not carrying anything."

    def _do_look(self) -> str:
        if self.location is None:
            return (
                f"You are in the middle of a room. Looking quickly around you, you see {_listing(list(self.contents))}."
            )
        return f"You are facing the {self.location}. Next to it, you see nothing."

    # ------------------------------------------------------------------------------------------------ goal

    def _placed(self) -> list[str]:
        """Objects of the task's type already in/on a target receptacle, in the required state."""
        t = self.task
        return [
            o
            for r, objs in self.contents.items()
            if kind(r) == t.target
            for o in objs
            if kind(o) == t.obj and (t.state is None or t.state in self.states.get(o, ()))
        ]

    def subgoals(self) -> set[str]:
        """The task's subgoals that hold now: "hold" (an object of the task's type in hand), "state" (one in hand
        or placed with the state the task asks for), "placed k" (k objects placed, k up to the task's count), "lamp"
        (look_at_obj_in_light: holding it where the desklamp is)."""
        t, out = self.task, set()
        held = [o for o in self.inventory if kind(o) == t.obj]
        if held:
            out.add("hold")
        placed = self._placed()
        if t.state is not None and any(t.state in self.states.get(o, ()) for o in held + placed):
            out.add("state")
        out |= {f"placed {k}" for k in range(1, min(len(placed), t.count) + 1)}
        if t.target is None and held and LAMP in self._visible():
            out.add("lamp")
        return out

    def _goal_met(self) -> bool:
        t = self.task
        if t.target is None:  # look_at_obj_in_light: hold the object by the lit lamp
            holding = any(kind(o) == t.obj for o in self.inventory)
            return holding and self.lamp_on and LAMP in self._visible()
        return len(self._placed()) >= t.count

    # ------------------------------------------------------------------------------------------------ actions

    def action_choices(self) -> list[str] | None:
        """`available_actions()`, for constrained sampling; None once the episode is over."""
        return self.available_actions() or None

    def available_actions(self) -> list[str]:
        """ALFWorld's admissible commands in the current state."""
        if self.done:
            return []
        loc, held = self.location, self.inventory[0] if self.inventory else None
        actions = [f"go to {r}" for r in self.contents if r != loc]
        if loc is not None:
            if kind(loc) in OPENABLE:
                actions.append(f"open {loc}" if loc in self.closed else f"close {loc}")
            visible = self._visible()
            if held is None:
                actions += [f"take {o} from {loc}" for o in visible if o != LAMP]
            elif loc not in self.closed:
                actions.append(f"move {held} to {loc}")
            if held is not None and kind(loc) in VERB:
                actions.append(f"{VERB[kind(loc)]} {held} with {loc}")
            if LAMP in visible and not self.lamp_on:
                actions.append(f"use {LAMP}")
            actions += [f"examine {loc}", *(f"examine {o}" for o in visible)]
        if held is not None:
            actions.append(f"examine {held}")
        return actions + ["inventory", "look"]

    def expert_action(self) -> str:
        """The scripted expert's next command. It finds a wanted object among what it has seen (else explores the
        next unseen receptacle), takes it, heats/cools/cleans it at the appliance, and puts it in the first target
        receptacle, or for look_at_obj_in_light carries it to the desklamp and turns that on."""
        t, loc = self.task, self.location
        held = self.inventory[0] if self.inventory else None
        if held is not None and kind(held) != t.obj:
            return self._expert_drop(held)
        if held is None:
            placed = set(self._placed())
            seen = [
                (r != loc, i, o, r)
                for i, r in enumerate(self.contents)
                if r in self.observed
                for o in self.contents[r]
                if kind(o) == t.obj and o not in placed
            ]
            if not seen:
                return self._expert_explore()
            *_, obj, r = min(seen)  # prefer one right here, then the first in the listing
            return self._expert_approach(r) or f"take {obj} from {r}"
        if t.target is None:
            lamp_at = next((r for r in self.contents if r in self.observed and LAMP in self.contents[r]), None)
            if lamp_at is None:  # lamps stand on open surfaces: no need to look inside anything
                return self._expert_explore(surfaces_only=True)
            return self._expert_approach(lamp_at) or f"use {LAMP}"
        if t.state is not None and t.state not in self.states.get(held, ()):
            appliance = next(r for r in self.contents if kind(r) == APPLIANCE[t.type])
            return f"go to {appliance}" if loc != appliance else f"{VERB[kind(appliance)]} {held} with {appliance}"
        target = next(r for r in self.contents if kind(r) == t.target)
        return self._expert_approach(target) or f"move {held} to {target}"

    def _expert_approach(self, r: str) -> str | None:
        """Go to `r` and open it if needed; None once the agent stands at `r` and can reach into it."""
        if self.location != r:
            return f"go to {r}"
        return f"open {r}" if r in self.closed else None

    def _expert_explore(self, surfaces_only: bool = False) -> str:
        """Visit the next unseen receptacle in listing order (targets last: the objects never start there)."""
        unseen = sorted(
            (kind(r) == self.task.target, i, r)
            for i, r in enumerate(self.contents)
            if r not in self.observed and not (surfaces_only and kind(r) in OPENABLE)
        )
        if not unseen:
            return "look"
        return self._expert_approach(unseen[0][2]) or "look"

    def _expert_drop(self, held: str) -> str:
        """Put down an object the task does not need (only after some other policy picked it up)."""
        loc = self.location
        if loc is None:
            return f"go to {next(iter(self.contents))}"
        return f"open {loc}" if loc in self.closed else f"move {held} to {loc}"
