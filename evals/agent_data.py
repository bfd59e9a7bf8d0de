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
    page = lambda title: w[title.lower()]  # noqa: E731
    countries, cities, people = _by_kind("country"), _by_kind("city"), _by_kind("person")
    inventions = _by_kind("invention")
    rows: list[tuple[str, str, str, str, str]] = []  # (question, answer, type, category, rationale)

    for c in countries[:PER_KIND]:
        cap = page(c.facts["Capital"])
        rows.append(
            (
                f"What is the population of the capital of {c.title}?",
                cap.facts["Population"],
                "exactMatch",
                "wiki multi-hop",
                f"{c.title} -> capital {cap.title} -> population",
            )
        )
    for c in countries[PER_KIND : 2 * PER_KIND]:
        cap = page(c.facts["Capital"])
        rows.append(
            (
                f"Who is the mayor of the capital of {c.title}?",
                cap.facts["Mayor"],
                "exactMatch",
                "wiki multi-hop",
                f"{c.title} -> capital {cap.title} -> mayor",
            )
        )
    for inv in inventions[:PER_KIND]:
        who = page(inv.facts["Inventor"])
        rows.append(
            (
                f"In what year was the inventor of the {inv.title} born?",
                who.facts["Born"],
                "exactMatch",
                "wiki multi-hop",
                f"{inv.title} -> inventor {who.title} -> born",
            )
        )
    for p in [p for p in people if "Birthplace" in p.facts][:PER_KIND]:
        city = page(p.facts["Birthplace"])
        rows.append(
            (
                f"In which country was {p.title} born?",
                city.facts["Country"],
                "exactMatch",
                "wiki multi-hop",
                f"{p.title} -> birthplace {city.title} -> country",
            )
        )
    for city in cities[:PER_KIND]:
        country = page(city.facts["Country"])
        rows.append(
            (
                f"What language is spoken in the country where {city.title} is?",
                country.facts["Language"],
                "exactMatch",
                "wiki multi-hop",
                f"{city.title} -> country {country.title} -> language",
            )
        )
    for inv in inventions[PER_KIND : 2 * PER_KIND]:
        who = page(inv.facts["Inventor"])
        age = int(inv.facts["Year"]) - int(who.facts["Born"])
        rows.append(
            (
                f"How old was the inventor of the {inv.title} in the year it was invented?",
                str(age),
                "exactMatch",
                "wiki + python",
                f"{inv.title} year - {who.title} born",
            )
        )
    for c in countries[2 * PER_KIND : 3 * PER_KIND]:
        cap = page(c.facts["Capital"])
        gap = abs(int(cap.facts["Founded"]) - int(c.facts["Founded"]))
        rows.append(
            (
                f"How many years apart were the founding of {c.title} and the founding of its capital?",
                str(gap),
                "exactMatch",
                "wiki + python",
                f"|{cap.title} founded - {c.title} founded|",
            )
        )
    for a, b in zip(cities[PER_KIND : 2 * PER_KIND], cities[2 * PER_KIND : 3 * PER_KIND]):
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
    for c in countries[3 * PER_KIND : 4 * PER_KIND]:
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
    pool = [p for p in people[: 4 * PER_KIND] if "Born" in p.facts]
    for i in range(PER_KIND):
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
