"""`wiki(title)`: look a page up in the procedurally generated mini-wiki (see wiki_data.py).

Lookup ignores case, surrounding quotes, a leading "the" and underscores; an unknown title answers
"No page ..." with the closest titles, so the model can retry or fall back to `search`.

    get_tool("wiki")(title="moburg")   # "Moburg is a city in Bilovia. Country: Bilovia. Population: ..."
"""

from __future__ import annotations

import difflib
import re

from envs.tools.base import Tool
from envs.tools.wiki_data import Page, pages


def normalize_title(title: str) -> str:
    t = re.sub(r"[\s_]+", " ", str(title)).strip().strip("\"'`.").strip().lower()
    return re.sub(r"^(the|a|an) ", "", t)


def find_page(title: str) -> Page | None:
    return pages().get(normalize_title(title))


def close_titles(title: str, n: int = 3) -> list[str]:
    table = pages()
    keys = difflib.get_close_matches(normalize_title(title)[:100], list(table), n=n, cutoff=0.6)
    return [table[k].title for k in keys]


class WikiTool(Tool):
    name = "wiki"
    description = "Read the wiki page with this exact title (a country, city, person or invention)."
    parameters = {
        "type": "object",
        "properties": {"title": {"type": "string", "description": "page title, e.g. 'Moburg'"}},
        "required": ["title"],
    }

    def __call__(self, title: str) -> str:
        page = find_page(title)
        if page is not None:
            return page.text
        shown = str(title).strip()[:60]
        if close := close_titles(title):
            return f"No page {shown!r}. Close matches: {', '.join(close)}."
        return f"No page {shown!r}. Try search."
