"""The generated webshop_lite catalogue and shopping goals.

`catalogue()` builds 1,125 products (5 categories x 5 product types x 45) from a fixed RNG, so every process sees
the same shop. A `Goal` is drawn from one product: a subset of its attributes, one value per option axis and a
price bound above its price, so every goal is satisfiable. `make_goal(split, seed)` keeps a goal only if
`goal_split(goal)` (a hash of everything but the price) names that split, so train and test never share a goal.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from dataclasses import dataclass

_COLORS = ("black", "white", "navy", "grey", "red", "blue", "green", "beige")
_SIZES = ("small", "medium", "large", "x-large")
_SCENTS = ("lavender", "coconut", "mint", "citrus", "vanilla", "unscented")
_SHADES = ("nude", "red", "pink", "berry", "coral", "plum")
_WOODS = ("walnut", "oak", "white", "black", "espresso")

# type -> (category, attribute pool, option axes -> value pool, price range in dollars)
TYPES: dict[str, tuple[str, tuple[str, ...], dict[str, tuple[str, ...]], tuple[float, float]]] = {
    # fashion
    "t-shirt": ("fashion", ("cotton", "slim fit", "short sleeve", "long sleeve", "machine wash", "moisture wicking"),
                {"color": _COLORS, "size": _SIZES}, (8, 35)),
    "hoodie": ("fashion", ("fleece lined", "cotton", "pullover", "zip up", "machine wash", "drawstring hood"),
               {"color": _COLORS, "size": _SIZES}, (20, 60)),
    "jeans": ("fashion", ("slim fit", "straight leg", "stretch denim", "high waist", "button closure", "machine wash"),
              {"color": ("blue", "black", "light wash", "dark wash"), "size": ("28w", "30w", "32w", "34w", "36w")},
              (25, 80)),
    "sneakers": ("fashion", ("lightweight", "non slip", "breathable mesh", "memory foam", "rubber sole", "lace up"),
                 {"color": _COLORS, "size": ("7", "8", "9", "10", "11")}, (30, 120)),
    "dress": ("fashion", ("floral print", "a-line", "v-neck", "short sleeve", "with pockets", "machine wash"),
              {"color": _COLORS, "size": _SIZES}, (20, 70)),
    # beauty
    "shampoo": ("beauty", ("sulfate free", "paraben free", "for dry hair", "natural ingredients", "cruelty free",
                           "color safe"), {"scent": _SCENTS, "size": ("8 fl oz", "12 fl oz", "16 fl oz", "32 fl oz")},
                (6, 30)),
    "face moisturizer": ("beauty", ("hyaluronic acid", "fragrance free", "for sensitive skin", "spf 30",
                                    "non comedogenic", "vegan"), {"size": ("1.7 oz", "2.5 oz", "3.4 oz")}, (10, 50)),
    "lipstick": ("beauty", ("long lasting", "matte finish", "cruelty free", "vegan", "moisturizing", "waterproof"),
                 {"color": _SHADES}, (5, 25)),
    "nail polish": ("beauty", ("quick dry", "chip resistant", "non toxic", "gel finish", "vegan", "high shine"),
                    {"color": _SHADES, "pack": ("pack of 1", "pack of 3", "pack of 6")}, (5, 25)),
    "body wash": ("beauty", ("moisturizing", "paraben free", "natural ingredients", "for sensitive skin",
                             "cruelty free", "sulfate free"), {"scent": _SCENTS, "size": ("12 fl oz", "18 fl oz")},
                  (5, 25)),
    # grocery
    "coffee": ("grocery", ("organic", "fair trade", "whole bean", "ground", "dark roast", "decaf"),
               {"size": ("12 ounce", "2 pound", "5 pound"), "pack": ("pack of 1", "pack of 2", "pack of 3")}, (8, 45)),
    "green tea": ("grocery", ("organic", "caffeine free", "non gmo", "kosher", "individually wrapped", "loose leaf"),
                  {"flavor": ("jasmine", "mint", "lemon", "ginger", "peach"),
                   "pack": ("20 count", "50 count", "100 count")}, (5, 30)),
    "snack bars": ("grocery", ("gluten free", "high protein", "low sugar", "keto friendly", "non gmo", "vegan"),
                   {"flavor": ("chocolate", "peanut butter", "almond", "berry", "coconut"),
                    "pack": ("pack of 6", "pack of 12", "pack of 24")}, (8, 40)),
    "pasta": ("grocery", ("gluten free", "organic", "whole wheat", "non gmo", "high fiber", "kosher"),
              {"size": ("1 pound", "2 pound"), "pack": ("pack of 4", "pack of 8", "pack of 12")}, (5, 35)),
    "dark chocolate": ("grocery", ("sugar free", "organic", "fair trade", "dairy free", "non gmo", "keto friendly"),
                       {"flavor": ("sea salt", "mint", "orange", "almond", "raspberry"),
                        "pack": ("pack of 3", "pack of 6", "pack of 12")}, (6, 40)),
    # furniture
    "office chair": ("furniture", ("ergonomic", "lumbar support", "adjustable height", "mesh back", "swivel",
                                   "with armrests"), {"color": ("black", "grey", "white", "blue")}, (60, 300)),
    "bookshelf": ("furniture", ("solid wood", "easy assembly", "5 tier", "adjustable shelves", "metal frame",
                                "space saving"), {"color": _WOODS, "size": ("small", "medium", "large")}, (40, 200)),
    "coffee table": ("furniture", ("solid wood", "storage space", "easy assembly", "metal frame", "round",
                                   "lift top"), {"color": _WOODS}, (50, 250)),
    "bed frame": ("furniture", ("metal frame", "easy assembly", "noise free", "under bed storage", "with headboard",
                                "no box spring needed"), {"color": _WOODS, "size": ("twin", "full", "queen", "king")},
                  (80, 400)),
    "desk": ("furniture", ("l-shaped", "easy assembly", "storage shelves", "metal frame", "home office",
                           "solid wood"), {"color": _WOODS, "size": ("40 inch", "47 inch", "55 inch")}, (60, 300)),
    # electronics
    "headphones": ("electronics", ("wireless", "noise cancelling", "over ear", "long battery life",
                                   "built-in microphone", "foldable"), {"color": ("black", "white", "blue", "red")},
                   (20, 200)),
    "phone case": ("electronics", ("shockproof", "slim", "wireless charging compatible", "kickstand", "clear",
                                   "card holder"), {"color": _COLORS, "model": ("iphone 13", "iphone 14", "iphone 15",
                                                                                "galaxy s23")}, (8, 30)),
    "usb cable": ("electronics", ("fast charging", "braided", "usb c", "durable", "data transfer", "tangle free"),
                  {"color": ("black", "white", "grey", "red"), "length": ("3 ft", "6 ft", "10 ft")}, (5, 25)),
    "bluetooth speaker": ("electronics", ("waterproof", "portable", "long battery life", "bass boost", "wireless",
                                          "built-in microphone"), {"color": ("black", "blue", "red", "green")},
                          (20, 150)),
    "power bank": ("electronics", ("fast charging", "portable", "usb c", "high capacity", "led display", "slim"),
                   {"color": ("black", "white", "blue"), "capacity": ("10000mah", "20000mah", "30000mah")},
                   (15, 70)),
}  # fmt: skip

BRANDS = tuple(
    """
aldwin brightfield corvo dunmore elmstead fenwick galloway harlow ivybridge juniper kestrel lindqvist
marlowe northgate oakhurst pemberton quillon redfern sable thornbury umbra vantage westbrook yarrow
zephyr ashgrove bellamy calloway delmar everly
""".split()
)
PER_TYPE = 45
RESULTS_LIMIT = 50  # the original engine also returns at most 50 results (5 pages of 10)

# how each option axis reads inside an instruction
_OPTION_PHRASE = {
    "color": "in {} color",
    "size": "in size {}",
    "scent": "with {} scent",
    "flavor": "in {} flavor",
    "pack": "in {}",
    "model": "for {}",
    "length": "in {} length",
    "capacity": "with {} capacity",
}


@dataclass(frozen=True)
class Product:
    asin: str  # e.g. "B0K7QX"; clicked lower-cased
    title: str
    category: str
    type: str  # e.g. "t-shirt"
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]  # axis -> values on offer, e.g. {"color": ("red", "navy")}
    price: float
    description: str
    features: tuple[str, ...]


@dataclass(frozen=True)
class Goal:
    instruction: str  # what the shopper sees
    query: str  # the instruction without its price clause (what the expert searches)
    category: str
    type: str
    attributes: tuple[str, ...]
    options: dict[str, str]  # axis -> wanted value
    price_bound: float
    asin: str  # the product the goal was drawn from; it satisfies the goal


def _title_case(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split())


def _make_product(rng: random.Random, asin: str, ptype: str, brand: str) -> Product:
    category, pool, axes, (lo, hi) = TYPES[ptype]
    attributes = tuple(rng.sample(pool, rng.randint(3, 4)))
    options = {}
    for axis, values in axes.items():
        offered = set(rng.sample(values, rng.randint(2, min(4, len(values)))))
        options[axis] = tuple(v for v in values if v in offered)  # keep the pool's order on the page
    title = _title_case(f"{brand} {attributes[0]} {attributes[1]} {ptype}")
    return Product(
        asin=asin,
        title=title,
        category=category,
        type=ptype,
        attributes=attributes,
        options=options,
        price=round(rng.uniform(lo, hi), 2),
        description=f"{_title_case(brand)} {ptype}: {', '.join(attributes)}.",
        features=tuple(a.capitalize() for a in attributes),
    )


@functools.lru_cache(maxsize=1)
def catalogue() -> tuple[Product, ...]:
    """Every product, in a fixed order. Titles and ASINs are unique."""
    rng = random.Random("webshop-catalogue")
    products, titles, asins = [], set(), set()
    alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ0123456789"
    for ptype in TYPES:
        made = 0
        while made < PER_TYPE:
            asin = "B0" + "".join(rng.choice(alphabet) for _ in range(4))
            product = _make_product(rng, asin, ptype, rng.choice(BRANDS))
            if product.title in titles or asin in asins:
                continue
            titles.add(product.title)
            asins.add(asin)
            products.append(product)
            made += 1
    return tuple(products)


@functools.lru_cache(maxsize=1)
def products_by_asin() -> dict[str, Product]:
    return {p.asin.lower(): p for p in catalogue()}


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _join(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def sample_goal(rng: random.Random, product: Product) -> Goal:
    """A goal that `product` satisfies: 1-3 of its attributes, one offered value per option axis, a price bound
    at the next multiple of 10 dollars above its price."""
    attributes = tuple(rng.sample(product.attributes, rng.randint(1, min(3, len(product.attributes)))))
    options = {axis: rng.choice(values) for axis, values in product.options.items()}
    bound = float((math.floor(product.price / 10) + 1) * 10)
    opts = _join([_OPTION_PHRASE[axis].format(v) for axis, v in options.items()]) if options else ""
    attrs = _join(list(attributes))
    kind = rng.randrange(3)
    if kind == 0:
        query = f"i need {_article(product.type)} {product.type} that is {attrs}"
    elif kind == 1:
        query = f"i am looking for {_article(attributes[0])} {attrs} {product.type}"
    else:
        query = f"find me {attrs} {product.type}"
    query += f", {opts}" if opts else ""
    return Goal(
        instruction=f"{query}, and price lower than {bound:.2f} dollars",
        query=query,
        category=product.category,
        type=product.type,
        attributes=attributes,
        options=options,
        price_bound=bound,
        asin=product.asin,
    )


def goal_split(goal: Goal) -> str:
    """ "test" for one goal in five, by a stable hash of type, attributes and options (the price is left out, so a
    test goal is never a train goal with another bound)."""
    key = "|".join([goal.type, *sorted(goal.attributes), *sorted(f"{a}={v}" for a, v in goal.options.items())])
    return "test" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 5 == 0 else "train"


def make_goal(split: str, seed: int) -> Goal:
    """The goal of episode `seed` of `split`: deterministic, resampled until it belongs to `split`."""
    rng = random.Random(f"webshop/{split}/{seed}")
    products = catalogue()
    while True:
        goal = sample_goal(rng, rng.choice(products))
        if goal_split(goal) == split:
            return goal


def satisfies(goal: Goal, product: Product) -> bool:
    """Whether buying `product` (with the goal's options chosen) would earn reward 1.0."""
    return (
        product.type == goal.type
        and set(goal.attributes) <= set(product.attributes)
        and all(v in product.options.get(axis, ()) for axis, v in goal.options.items())
        and product.price <= goal.price_bound
    )
