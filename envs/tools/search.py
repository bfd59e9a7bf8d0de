"""`search(query)`: BM25 over the mini-wiki (one document per page), returning the top titles and snippets.

    from envs.tools import get_tool
    get_tool("search")(query="mayor Feth Norbaeth")   # "1. Moburg: Moburg is a city in Bilovia. 2. ..."

Ranking is BM25 over the page texts; a query that is exactly a page title returns that page first.

`BM25` is a small standalone index (Okapi BM25, k1=1.2, b=0.75) over any list of strings.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter

from envs.tools.base import Tool
from envs.tools.wiki import find_page
from envs.tools.wiki_data import Page, pages

_STOPWORDS = frozenset(
    "a an and are as at be by did does for from has have in is it its of on or the to was what when where "
    "which who whom whose with".split()
)


def tokenize(text: str) -> list[str]:
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in _STOPWORDS]


class BM25:
    def __init__(self, docs: list[str], k1: float = 1.2, b: float = 0.75):
        self.k1, self.b = k1, b
        self.tfs = [Counter(tokenize(d)) for d in docs]
        self.lengths = [sum(tf.values()) for tf in self.tfs]
        self.avg_len = sum(self.lengths) / max(len(docs), 1)
        df = Counter(term for tf in self.tfs for term in tf)
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
        self.postings: dict[str, list[int]] = {}  # term -> ids of the docs containing it
        for i, tf in enumerate(self.tfs):
            for t in tf:
                self.postings.setdefault(t, []).append(i)

    def search(self, query: str, k: int = 3) -> list[tuple[int, float]]:
        """Top-k (doc index, score), best first; ties broken by doc index. Docs sharing no term are left out."""
        scores: dict[int, float] = {}
        for t in set(tokenize(query)):
            for i in self.postings.get(t, ()):
                tf = self.tfs[i][t]
                norm = tf + self.k1 * (1 - self.b + self.b * self.lengths[i] / self.avg_len)
                scores[i] = scores.get(i, 0.0) + self.idf[t] * tf * (self.k1 + 1) / norm
        return sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))[:k]


@functools.lru_cache(maxsize=1)
def _wiki_index() -> tuple[list, BM25]:
    docs = list(pages().values())
    return docs, BM25([p.text for p in docs])


def _ranked(query: str, k: int) -> list[Page]:
    """BM25 over page texts, except that a query naming a page exactly gets that page first (as a wiki's
    search box would). Boosting titles inside BM25 instead would rank person X above "the city whose mayor
    is X" for the question "Which city has the mayor X?"."""
    docs, index = _wiki_index()
    exact = find_page(query)
    hits = [docs[i] for i, _ in index.search(query, k + 1) if docs[i] is not exact]
    return ([exact] if exact else []) + hits[: k - (exact is not None)]


def search_wiki(query: str, k: int = 3) -> list[str]:
    """Titles of the top-k pages for `query`."""
    return [p.title for p in _ranked(query, k)]


class SearchTool(Tool):
    name = "search"
    description = "Search the wiki. Returns the titles and first lines of the best matching pages."
    parameters = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "keywords, e.g. 'mayor Ada Lin'"}},
        "required": ["query"],
    }

    def __init__(self, k: int = 3):
        self.k = k

    def __call__(self, query: str) -> str:
        hits = _ranked(query[:500], self.k)
        if not hits:
            return f"No results for {query[:80]!r}."
        return " ".join(f"{rank}. {p.title}: {p.summary}" for rank, p in enumerate(hits, 1))
