"""Generated ALFWorld-style households: rooms, receptacles, objects and one of the six task types.

`make_layout(split, seed)` draws a task (type, object type, target receptacle type), a room that supports it,
6-10 receptacles (numbered like "cabinet 2") and objects placed where they belong (apples on countertops or in
the fridge, pens in drawers ...). Layouts are kept only if `task_split(task)` names the split, so train and test
never share a task, and therefore never a layout.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

TASK_TYPES = (
    "pick_and_place",
    "look_at_obj_in_light",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "pick_two_obj",
)
OPENABLE = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})
# receptacle types a task puts things "in" (the rest take "on"): "put a mug in cabinet", "put a mug on shelf"
_IN = frozenset(OPENABLE | {"sinkbasin", "bathtubbasin", "garbagecan", "laundryhamper", "coffeemachine"})
APPLIANCE = {
    "pick_clean_then_place": "sinkbasin",
    "pick_heat_then_place": "microwave",
    "pick_cool_then_place": "fridge",
}
VERB = {"sinkbasin": "clean", "bathtubbasin": "clean", "microwave": "heat", "fridge": "cool"}
STATE = {"clean": "clean", "heat": "hot", "cool": "cool"}  # verb -> the object state it sets
NOT_TARGETS = frozenset({"toaster", "towelholder", "handtowelholder", "toiletpaperhanger"})
LAMP_HOLDERS = frozenset({"desk", "sidetable", "dresser"})
LAMP = "desklamp 1"

# room -> receptacle type -> most instances of it in one layout
ROOMS: dict[str, dict[str, int]] = {
    "kitchen": {
        "cabinet": 4,
        "coffeemachine": 1,
        "countertop": 2,
        "diningtable": 1,
        "drawer": 3,
        "fridge": 1,
        "garbagecan": 1,
        "microwave": 1,
        "shelf": 2,
        "sinkbasin": 1,
        "stoveburner": 2,
        "toaster": 1,
    },
    "bathroom": {
        "bathtubbasin": 1,
        "cabinet": 4,
        "countertop": 1,
        "drawer": 2,
        "garbagecan": 1,
        "handtowelholder": 1,
        "shelf": 2,
        "sinkbasin": 2,
        "toilet": 1,
        "toiletpaperhanger": 1,
        "towelholder": 1,
    },
    "bedroom": {
        "armchair": 1,
        "bed": 1,
        "desk": 1,
        "drawer": 4,
        "dresser": 1,
        "garbagecan": 1,
        "laundryhamper": 1,
        "safe": 1,
        "shelf": 3,
        "sidetable": 2,
    },
    "livingroom": {
        "armchair": 1,
        "cabinet": 2,
        "coffeetable": 1,
        "diningtable": 1,
        "drawer": 2,
        "garbagecan": 1,
        "shelf": 2,
        "sidetable": 2,
        "sofa": 1,
        "tvstand": 1,
    },
}

# room -> object type -> receptacle types it may start in
OBJECTS: dict[str, dict[str, str]] = {
    "kitchen": {
        "apple": "countertop diningtable fridge microwave garbagecan sinkbasin",
        "bread": "countertop diningtable fridge cabinet",
        "egg": "countertop diningtable fridge microwave garbagecan",
        "potato": "countertop diningtable fridge microwave sinkbasin",
        "tomato": "countertop diningtable fridge sinkbasin",
        "lettuce": "countertop diningtable fridge",
        "mug": "countertop diningtable cabinet shelf coffeemachine sinkbasin microwave",
        "cup": "countertop diningtable cabinet shelf fridge sinkbasin",
        "plate": "countertop diningtable cabinet shelf fridge",
        "bowl": "countertop diningtable cabinet shelf fridge",
        "pan": "stoveburner countertop cabinet",
        "pot": "stoveburner countertop cabinet",
        "knife": "countertop diningtable drawer",
        "spoon": "countertop diningtable drawer sinkbasin",
        "spatula": "countertop diningtable drawer",
        "saltshaker": "countertop diningtable cabinet shelf",
        "dishsponge": "countertop sinkbasin cabinet drawer",
    },
    "bathroom": {
        "soapbar": "countertop sinkbasin bathtubbasin toilet cabinet",
        "soapbottle": "countertop cabinet shelf toilet",
        "spraybottle": "countertop cabinet shelf toilet",
        "toiletpaper": "toiletpaperhanger countertop cabinet shelf toilet",
        "candle": "countertop cabinet shelf toilet",
        "cloth": "countertop cabinet drawer bathtubbasin",
        "towel": "towelholder",
        "handtowel": "handtowelholder",
        "tissuebox": "countertop shelf toilet",
    },
    "bedroom": {
        "book": "bed desk sidetable shelf dresser",
        "cd": "desk sidetable drawer shelf safe",
        "cellphone": "bed desk sidetable drawer dresser",
        "pen": "desk sidetable drawer shelf",
        "pencil": "desk sidetable drawer shelf",
        "keychain": "desk sidetable drawer dresser safe",
        "creditcard": "desk sidetable drawer dresser safe",
        "alarmclock": "desk sidetable dresser shelf",
        "pillow": "bed armchair",
        "laptop": "bed desk",
        "cloth": "laundryhamper dresser drawer",
    },
    "livingroom": {
        "remotecontrol": "sofa armchair coffeetable sidetable tvstand",
        "newspaper": "sofa armchair coffeetable sidetable diningtable",
        "keychain": "coffeetable sidetable drawer cabinet",
        "creditcard": "coffeetable sidetable drawer diningtable",
        "book": "coffeetable sidetable shelf diningtable",
        "vase": "shelf sidetable coffeetable diningtable cabinet",
        "statue": "shelf sidetable coffeetable tvstand",
        "box": "sofa coffeetable shelf cabinet",
        "pillow": "sofa armchair",
        "laptop": "sofa coffeetable diningtable",
        "watch": "coffeetable sidetable drawer",
    },
}

HEATABLE = frozenset("apple bread egg potato tomato mug cup".split())
COOLABLE = frozenset("apple bread egg potato tomato lettuce mug cup plate bowl pan pot".split())
CLEANABLE = frozenset(
    "apple lettuce potato tomato mug cup plate bowl pan pot knife spoon spatula soapbar cloth".split()
)
_ELIGIBLE = {
    "pick_clean_then_place": CLEANABLE,
    "pick_heat_then_place": HEATABLE,
    "pick_cool_then_place": COOLABLE,
}

_TEMPLATES = {
    "pick_and_place": ("put a {o} {p} {r}.", "put some {o} {p} {r}."),
    "look_at_obj_in_light": ("look at {o} under the desklamp.", "examine the {o} with the desklamp."),
    "pick_clean_then_place": ("put a clean {o} {p} {r}.", "clean some {o} and put it {p} {r}."),
    "pick_heat_then_place": ("put a hot {o} {p} {r}.", "heat some {o} and put it {p} {r}."),
    "pick_cool_then_place": ("put a cool {o} {p} {r}.", "cool some {o} and put it {p} {r}."),
    "pick_two_obj": ("put two {o} {p} {r}.", "find two {o} and put them {p} {r}."),
}


@dataclass(frozen=True)
class Task:
    type: str  # one of TASK_TYPES
    obj: str  # object type, e.g. "apple"
    target: str | None  # receptacle type to put it in/on; None for look_at_obj_in_light
    text: str  # "put a hot apple in countertop."

    @property
    def count(self) -> int:
        return 2 if self.type == "pick_two_obj" else 1

    @property
    def state(self) -> str | None:
        """The object state the goal asks for ("clean" | "hot" | "cool"), if any."""
        appliance = APPLIANCE.get(self.type)
        return STATE[VERB[appliance]] if appliance else None


@dataclass(frozen=True)
class Layout:
    room: str
    receptacles: tuple[str, ...]  # "cabinet 1", ... in the order the opening observation lists them
    contents: dict[str, tuple[str, ...]]  # receptacle -> objects in/on it at the start
    task: Task


def kind(name: str) -> str:
    """ "cabinet 12" -> "cabinet"."""
    return name.rsplit(" ", 1)[0]


def preposition(receptacle_type: str) -> str:
    return "in" if receptacle_type in _IN else "on"


def task_split(task: Task) -> str:
    """ "test" for one task in four, by a stable hash of (type, object, target)."""
    key = f"{task.type}|{task.obj}|{task.target}"
    return "test" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 4 == 0 else "train"


def _rooms_for(task_type: str) -> list[str]:
    if task_type == "look_at_obj_in_light":
        return [r for r in ROOMS if LAMP_HOLDERS & set(ROOMS[r])]
    appliance = APPLIANCE.get(task_type)
    return [r for r in ROOMS if appliance is None or appliance in ROOMS[r]]


def _sample(rng: random.Random, n_receptacles: tuple[int, int]) -> Layout | None:
    """One layout, or None when the draw cannot host its task (the caller draws again)."""
    task_type = rng.choice(TASK_TYPES)
    room = rng.choice(_rooms_for(task_type))
    types, objects = ROOMS[room], OBJECTS[room]
    eligible = [o for o in objects if o in _ELIGIBLE.get(task_type, objects)]
    obj = rng.choice(eligible)
    appliance = APPLIANCE.get(task_type)
    required: list[str] = [appliance] if appliance else []
    if task_type == "look_at_obj_in_light":
        target, holder = None, rng.choice(sorted(LAMP_HOLDERS & set(types)))
        required.append(holder)
    else:
        target = rng.choice([t for t in types if t not in NOT_TARGETS and t != appliance])
        required.append(target)
    sources = [t for t in objects[obj].split() if t in types and t != target]
    if not sources:
        return None
    required.append(rng.choice(sources))

    # receptacles: the required ones, then random extra instances up to n (ALFWorld rooms number repeats)
    counts = dict.fromkeys(required, 1)
    n = min(rng.randint(*n_receptacles), sum(types.values()))
    while sum(counts.values()) < n:
        t = rng.choice(list(types))
        if counts.get(t, 0) < types[t]:
            counts[t] = counts.get(t, 0) + 1
    receptacles = tuple(f"{t} {i}" for t in sorted(counts) for i in range(1, counts[t] + 1))
    contents: dict[str, list[str]] = {r: [] for r in receptacles}

    numbers: dict[str, int] = {}

    def place(o: str, allowed: list[str]) -> None:
        if allowed:
            numbers[o] = numbers.get(o, 0) + 1
            contents[rng.choice(allowed)].append(f"{o} {numbers[o]}")

    starts = [r for r in receptacles if kind(r) in sources]  # never already in the target
    for _ in range(rng.choice((2, 3)) if task_type == "pick_two_obj" else rng.choice((1, 1, 2))):
        place(obj, starts)
    if task_type == "look_at_obj_in_light":
        contents[f"{holder} 1"].append(LAMP)
    for _ in range(rng.randint(3, 6)):
        other = rng.choice([o for o in objects if o != obj])
        place(other, [r for r in receptacles if kind(r) in objects[other].split()])

    template = rng.choice(_TEMPLATES[task_type])
    text = template.format(o=obj, p=preposition(target) if target else "", r=target)
    task = Task(type=task_type, obj=obj, target=target, text=text)
    return Layout(room, receptacles, {r: tuple(v) for r, v in contents.items()}, task)


def make_layout(split: str, seed: int, n_receptacles: tuple[int, int] = (6, 10)) -> Layout:
    """The layout of episode `seed` of `split`: deterministic, redrawn until its task belongs to `split`. "seen" is
    ALFWorld's in-distribution held-out set (valid_seen): tasks of the train split's (type, object, target) kinds
    in households drawn from their own seed stream, so none is a training episode; "test" holds the unseen kinds.
    "validation" and "validation_seen" hold the same kinds as "test" and "seen", in households of their own seed
    streams: for choosing the lr and the steps without reading the test split."""
    kinds = {"train": "train", "test": "test", "seen": "train", "validation": "test", "validation_seen": "train"}
    if split not in kinds:
        raise ValueError(f"split must be one of {', '.join(kinds)}, got {split!r}")
    rng = random.Random(f"alfworld/{split}/{seed}")
    while True:
        layout = _sample(rng, n_receptacles)
        if layout is not None and task_split(layout.task) == kinds[split]:
            return layout
