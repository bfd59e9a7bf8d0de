"""Builds the shipped agent-benchmark sample (evals/data/hle_sample.jsonl) in HLE's schema from the mini-wiki.

    python -m evals.agent_data            # rewrite the file (deterministic)

Every question needs two or more tool calls: multi-hop wiki lookups (the population of a country's capital),
lookups plus arithmetic for python_exec (how old an inventor was at the invention), and multiple-choice questions
over several pages. Questions are about held-out entities (`wiki_data.is_test_entity`) where the world allows,
so the tool_use training split never states their facts.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

from envs.tools.wiki_data import Page, is_test_entity, pages

OUT = Path(__file__).parent / "data" / "hle_sample.jsonl"
PER_KIND = 6


def _by_kind(kind: str) -> list[Page]:
    ps = [p for p in pages().values() if p.kind == kind]
    return sorted(ps, key=lambda p: (not is_test_entity(p.title), p.title))  # held-out entities first


def _choices(rng: random.Random, right: str, wrong: list[str]) -> tuple[str, str]:
    """("A. x B. y ..." text, letter of `right`) with the options shuffled."""
    opts = [right] + wrong
    rng.shuffle(opts)
    letters = "ABCDE"
    return " ".join(f"{letters[i]}. {o}" for i, o in enumerate(opts)), letters[opts.index(right)]


def build(seed: int = 0) -> list[dict]:
    rng = random.Random(f"nanosky/hle_sample/{seed}")
    w = pages()
    countries, cities, people = _by_kind("country"), _by_kind("city"), _by_kind("person")
    inventions = _by_kind("invention")
    rows: list[tuple[str, str, str, str, str]] = []  # (question, answer, type, category, rationale)

    def hops(entities: list[Page], link: str, question: str, answer, why: str, category: str) -> None:
        """An exactMatch row per entity `e`, two lookups deep: `e`'s page, then the page `h` its fact `link` names.
        `question` and `why` are formatted with both titles; `answer(e, h)` reads the facts."""
        for e in entities:
            h = w[e.facts[link].lower()]
            rows.append(
                (question.format(e=e.title), answer(e, h), "exactMatch", category, why.format(e=e.title, h=h.title))
            )

    def multi_hop(entities: list[Page], link: str, question: str, asked: str) -> None:
        """The answer is the second page's fact `asked`."""
        why = f"{{e}} -> {link.lower()} {{h}} -> {asked.lower()}"
        hops(entities, link, question, lambda e, h: h.facts[asked], why, "wiki multi-hop")

    k = PER_KIND
    multi_hop(countries[:k], "Capital", "What is the population of the capital of {e}?", "Population")
    multi_hop(countries[k : 2 * k], "Capital", "Who is the mayor of the capital of {e}?", "Mayor")
    multi_hop(inventions[:k], "Inventor", "In what year was the inventor of the {e} born?", "Born")
    born_in = [p for p in people if "Birthplace" in p.facts]
    multi_hop(born_in[:k], "Birthplace", "In which country was {e} born?", "Country")
    multi_hop(cities[:k], "Country", "What language is spoken in the country where {e} is?", "Language")
    hops(
        inventions[k : 2 * k],
        "Inventor",
        "How old was the inventor of the {e} in the year it was invented?",
        lambda e, h: str(int(e.facts["Year"]) - int(h.facts["Born"])),
        "{e} year - {h} born",
        "wiki + python",
    )
    hops(
        countries[2 * k : 3 * k],
        "Capital",
        "How many years apart were the founding of {e} and the founding of its capital?",
        lambda e, h: str(abs(int(h.facts["Founded"]) - int(e.facts["Founded"]))),
        "|{h} founded - {e} founded|",
        "wiki + python",
    )
    for a, b in zip(cities[k : 2 * k], cities[2 * k : 3 * k]):
        total = int(a.facts["Population"]) + int(b.facts["Population"])
        rows.append(
            (
                f"What is the combined population of {a.title} and {b.title}?",
                str(total),
                "exactMatch",
                "wiki + python",
                f"{a.title} + {b.title} populations",
            )
        )
    for c in countries[3 * k : 4 * k]:
        inside = [x for x in cities if x.facts["Country"] == c.title]
        outside = [x.title for x in cities if x.facts["Country"] != c.title]
        right = rng.choice(inside).title
        text, letter = _choices(rng, right, rng.sample(outside, 3))
        rows.append(
            (
                f"Which of these cities is in {c.title}?\nAnswer Choices: {text}",
                letter,
                "multipleChoice",
                "wiki multiple choice",
                f"{right} is in {c.title}",
            )
        )
    pool = [p for p in people[: 4 * k] if "Born" in p.facts]
    for i in range(k):
        trio = pool[3 * i : 3 * i + 3]
        if len({p.facts["Born"] for p in trio}) < 3:
            continue  # a tie would make two options right
        first = min(trio, key=lambda p: int(p.facts["Born"])).title
        text, letter = _choices(rng, first, [p.title for p in trio if p.title != first])
        rows.append(
            (
                f"Which of these people was born first?\nAnswer Choices: {text}",
                letter,
                "multipleChoice",
                "wiki multiple choice",
                f"{first} has the earliest birth year",
            )
        )

    out = []
    for q, a, typ, cat, why in rows:
        out.append(
            {
                "id": hashlib.sha1(q.encode()).hexdigest()[:24],
                "question": q,
                "image": "",
                "answer": a,
                "answer_type": typ,
                "author_name": "nanosky",
                "rationale": why,
                "raw_subject": cat,
                "category": cat,
            }
        )
    return out


def write(path: Path = OUT) -> int:
    rows = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


if __name__ == "__main__":
    print(f"wrote {write()} rows to {OUT}")
