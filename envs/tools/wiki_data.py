"""A procedurally generated mini-wiki: fictional countries, cities, people and inventions.

`pages()` builds it once per process (deterministic, no files, ~320 pages, well under a second). Every page
has terse "Key: value" facts so a tiny model can copy an answer out of a tool result, and a text of at most
~30 words. The world is linked: a country has a capital city, a city a mayor, an invention an inventor who was
born in some city. `is_test_entity(title)` reserves a fifth of the entities for held-out questions.

    from envs.tools.wiki_data import pages
    p = pages()["brenmoor"]; p.title, p.facts["Population"]
"""

from __future__ import annotations

import functools
import random
import zlib
from dataclasses import dataclass, field

N_COUNTRIES, N_CITIES, N_PEOPLE, N_INVENTIONS = 24, 96, 120, 72

_ONSETS = (
    "b",
    "br",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "kr",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "tr",
    "v",
    "z",
    "th",
    "sh",
    "j",
)
_VOWELS = ("a", "e", "i", "o", "u", "ae", "io", "ou")
_CODAS = ("", "", "n", "r", "l", "s", "m", "th", "v", "nd", "rk")
_COUNTRY_ENDS = ("ia", "ovia", "land", "mark", "ora", "istan", "aria", "enia")
_CITY_ENDS = (
    "moor",
    "holm",
    "ford",
    "haven",
    "burg",
    "dale",
    "port",
    "wick",
    "gate",
    "field",
    "mouth",
    "stead",
)
_INV_HEADS = (
    "Sky",
    "Cloud",
    "Iron",
    "Glass",
    "Star",
    "Sun",
    "Frost",
    "Ember",
    "Tide",
    "Stone",
    "Wind",
    "Moon",
    "Copper",
    "Silver",
    "Echo",
    "Storm",
)
_INV_TAILS = (
    "loom",
    "wheel",
    "lamp",
    "engine",
    "scope",
    "press",
    "pump",
    "clock",
    "kiln",
    "mill",
    "lens",
    "drum",
    "sail",
    "forge",
)
_PROFESSIONS = (
    "engineer",
    "chemist",
    "painter",
    "teacher",
    "sailor",
    "doctor",
    "farmer",
    "architect",
    "poet",
    "merchant",
)
_VERBS = (
    "measuring",
    "cooling",
    "drying",
    "lifting",
    "sorting",
    "weaving",
    "heating",
    "cleaning",
    "storing",
    "cutting",
    "mixing",
    "printing",
)
_OBJECTS = (
    "wind",
    "bread",
    "cloth",
    "grain",
    "ice",
    "glass",
    "salt",
    "paper",
    "rope",
    "tea",
    "fish",
    "stone",
    "wool",
    "honey",
)


@dataclass(frozen=True)
class Page:
    title: str
    kind: str  # "country" | "city" | "person" | "invention"
    summary: str  # one short line, the search snippet
    facts: dict[str, str] = field(default_factory=dict)  # "Capital" -> "Brenmoor", ...

    @property
    def text(self) -> str:
        """What wiki(title) returns: the summary, then the facts. At most ~30 words."""
        return " ".join([self.summary] + [f"{k}: {v}." for k, v in self.facts.items()])


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))


def _unique(rng: random.Random, make, taken: set[str]) -> str:
    while True:
        name = make(rng)
        if name.lower() not in taken and 4 <= len(name) <= 14:
            taken.add(name.lower())
            return name


@functools.lru_cache(maxsize=1)
def pages() -> dict[str, Page]:
    """lower-cased title -> Page. Same world on every machine and every call."""
    rng = random.Random("nanosky/mini-wiki/v1")
    taken: set[str] = set()
    countries = [
        _unique(rng, lambda r: (_word(r, 1) + r.choice(_COUNTRY_ENDS)).capitalize(), taken) for _ in range(N_COUNTRIES)
    ]
    cities = [_unique(rng, lambda r: (_word(r, 1) + r.choice(_CITY_ENDS)).capitalize(), taken) for _ in range(N_CITIES)]
    people = [
        _unique(rng, lambda r: f"{_word(r, 1).capitalize()} {_word(r, 2).capitalize()}", taken) for _ in range(N_PEOPLE)
    ]
    inventions = [
        _unique(rng, lambda r: r.choice(_INV_HEADS) + r.choice(_INV_TAILS), taken) for _ in range(N_INVENTIONS)
    ]
    purposes = rng.sample([f"{v} {o}" for v in _VERBS for o in _OBJECTS], N_INVENTIONS)  # unique per invention

    country_of = {city: countries[i % N_COUNTRIES] for i, city in enumerate(cities)}  # 4 cities per country
    capital = {c: cities[i] for i, c in enumerate(countries)}  # the first city of each country
    mayors = rng.sample(people, N_CITIES)
    mayor_of = dict(zip(mayors, cities))
    inventors = rng.sample(people, N_INVENTIONS)  # a person may be both a mayor and an inventor
    invention_of = dict(zip(inventors, inventions))

    out: list[Page] = []
    for c in countries:
        founded, pop = rng.randint(800, 1900), rng.randint(200, 9000) * 1000
        lang = c[: -len(next(e for e in _COUNTRY_ENDS if c.endswith(e)))].capitalize() + "ish"
        facts = {"Capital": capital[c], "Population": str(pop), "Founded": str(founded), "Language": lang}
        out.append(Page(c, "country", f"{c} is a country.", facts))
    city_founded: dict[str, int] = {}
    for city in cities:
        city_founded[city] = rng.randint(900, 1950)
        facts = {
            "Country": country_of[city],
            "Population": str(rng.randint(5, 900) * 1000),
            "Founded": str(city_founded[city]),
            "Mayor": mayors[cities.index(city)],
        }
        out.append(Page(city, "city", f"{city} is a city in {country_of[city]}.", facts))
    birthplace = {p: rng.choice(cities) for p in people}
    born = {p: rng.randint(1820, 1990) for p in people}
    for p in people:
        facts = {"Born": str(born[p]), "Birthplace": birthplace[p], "Job": rng.choice(_PROFESSIONS)}
        if p in mayor_of:
            facts["Mayor of"] = mayor_of[p]
        if p in invention_of:
            facts["Invented"] = invention_of[p]
        out.append(Page(p, "person", f"{p} is a person.", facts))
    for inv, who, purpose in zip(inventions, inventors, purposes):
        year = born[who] + rng.randint(20, 60)
        facts = {"Inventor": who, "Year": str(year), "Use": purpose}
        out.append(Page(inv, "invention", f"The {inv} is an invention for {purpose}.", facts))
    return {p.title.lower(): p for p in out}


def is_test_entity(title: str) -> bool:
    """Held-out entities: questions about them only appear in the test split (stable across runs)."""
    return zlib.crc32(title.lower().encode()) % 5 == 0
