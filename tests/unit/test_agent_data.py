"""evals/agent_data.py: the shipped agent-benchmark sample is exactly what `build()` writes, and each answer is read
from the page its question leads to."""

import json

from envs.tools.wiki_data import pages
from evals.agent_data import OUT, build


def test_the_shipped_sample_is_what_build_writes_and_answers_follow_the_hops():
    rows = build()
    assert rows == [json.loads(line) for line in OUT.read_text(encoding="utf-8").splitlines()]
    assert len({r["id"] for r in rows}) == len(rows)
    w = pages()
    hops = [r for r in rows if r["category"] == "wiki multi-hop"]
    assert len(hops) == 30
    for r in hops:  # "A -> capital B -> population": the answer is B's fact, reached through A's
        first, link_second, asked = r["rationale"].split(" -> ")
        link, second = link_second.split(" ", 1)
        assert w[first.lower()].facts[link.capitalize()] == second
        assert w[second.lower()].facts[asked.capitalize()] == r["answer"], r
