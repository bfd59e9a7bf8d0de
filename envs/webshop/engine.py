"""Retrieval and reward for webshop_lite.

`search(query)` ranks the catalogue with BM25 over each product's title, type, category, attributes and option
values (ties broken by catalogue order), like the original's Pyserini index over product text.
`score_purchase(goal, product, chosen)` is the WebShop reward:

    r = type_factor * (matched attributes + matched options + [price <= bound]) / (#attributes + #options + 1)

with type_factor 1.0 for the goal's product type, 0.5 for another type of the same category and 0.1 otherwise.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter

from envs.webshop.catalog import RESULTS_LIMIT, Goal, Product, catalogue

_K1, _B = 1.2, 0.75  # the usual BM25 constants


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def _document(p: Product) -> list[str]:
    values = [v for vs in p.options.values() for v in vs]
    return tokenize(" ".join([p.title, p.type, p.category, *p.attributes, *values]))


@functools.lru_cache(maxsize=1)
def _index() -> tuple[dict[str, list[tuple[int, int]]], list[int], float]:
    """token -> [(product index, term count)], document lengths, mean document length."""
    postings: dict[str, list[tuple[int, int]]] = {}
    lengths = []
    for i, p in enumerate(catalogue()):
        doc = _document(p)
        lengths.append(len(doc))
        for tok, tf in Counter(doc).items():
            postings.setdefault(tok, []).append((i, tf))
    return postings, lengths, sum(lengths) / len(lengths)


def search(query: str, limit: int = RESULTS_LIMIT) -> list[int]:
    """Indices into `catalogue()` of the best `limit` matches for `query`, best first; [] if nothing matches."""
    postings, lengths, avg_len = _index()
    n = len(lengths)
    scores: dict[int, float] = {}
    for tok in set(tokenize(query)):
        docs = postings.get(tok, [])
        if not docs:
            continue
        idf = math.log(1 + (n - len(docs) + 0.5) / (len(docs) + 0.5))
        for i, tf in docs:
            norm = tf + _K1 * (1 - _B + _B * lengths[i] / avg_len)
            scores[i] = scores.get(i, 0.0) + idf * tf * (_K1 + 1) / norm
    return sorted(scores, key=lambda i: (-scores[i], i))[:limit]


def type_factor(goal: Goal, product: Product) -> float:
    if product.type == goal.type:
        return 1.0
    return 0.5 if product.category == goal.category else 0.1


def score_purchase(goal: Goal, product: Product, chosen: dict[str, str]) -> tuple[float, dict]:
    """Reward for buying `product` with options `chosen` (axis -> value) under `goal`, and its parts."""
    matched_attributes = sum(a in product.attributes for a in goal.attributes)
    matched_options = sum(chosen.get(axis) == value for axis, value in goal.options.items())
    price_ok = product.price <= goal.price_bound
    factor = type_factor(goal, product)
    total = len(goal.attributes) + len(goal.options) + 1
    reward = factor * (matched_attributes + matched_options + int(price_ok)) / total
    details = {
        "matched_attributes": matched_attributes,
        "matched_options": matched_options,
        "price_ok": price_ok,
        "type_factor": factor,
    }
    return reward, details
