"""sql_shop: a small generated SQLite database (people, shops, products, orders) and questions about it whose answers
are computed by SQL when they are generated: the task of `--preset mcp_sqlite`, played through `mcp-server-sqlite`.

    from envs.mcp.shop import build
    folder = build("/tmp/shop")    # shop.db (the template every episode copies), train/validation/test .jsonl

Everything comes from fixed seeds: the same database and questions on every machine. Held out by template and by
entity: each question template belongs to one split, and so does each person, shop and product it names, so a test
question asks something never asked in training about an entity never named there. Rows are in `--env dataset`'s
layout (`question`, `answer`), with the kind (`template`) and the expert's call (`calls`: `read_query` with the
template's SQL) beside them. `--env mcp_sqlite` (`SQLShopEnv`) is `--env mcp` on them, the server
`mcp-server-sqlite` on a fresh copy of the database per episode.
"""

from __future__ import annotations

import os
import random
import sqlite3

from envs.mcp import MCPEnv, publish, split_files, write_rows

DB_NAME = "shop.db"
SPLITS = ("train", "validation", "test")
CITIES = ("Lisbon", "Oslo", "Quito", "Perth", "Dakar", "Hanoi", "Lima", "Riga")
FIRST = ("Ana", "Ben", "Caro", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Max", "Nia", "Oto")
LAST = ("Silva", "Berg", "Mora", "Reyes", "Okafor", "Tran", "Novak", "Haas", "Ito", "Lund")
SHOP_WORDS = ("Corner", "Market", "Depot", "Bazaar", "Outlet", "Store", "Emporium", "Stall", "Hall", "Works")
CATEGORIES = {
    "fruit": ("apple", "pear", "plum", "mango", "kiwi", "fig", "lime", "melon"),
    "tools": ("hammer", "wrench", "saw", "drill", "chisel", "pliers", "level", "clamp"),
    "books": ("atlas", "novel", "almanac", "cookbook", "diary", "manual", "primer", "journal"),
    "toys": ("kite", "yoyo", "puzzle", "robot", "ball", "drum", "top", "whistle"),
}

# (template id, split, entity table, question, SQL with one `?` for the entity's name): answers are single values
TEMPLATES = (
    ("orders_by_person", "train", "people", "How many orders did {} place?",
     "SELECT COUNT(*) FROM orders o JOIN people p ON o.person_id = p.id WHERE p.name = ?"),
    ("city_of_shop", "train", "shops", "In which city is the shop {}?", "SELECT city FROM shops WHERE name = ?"),
    ("price_of_product", "train", "products", "What is the price of the {}, in whole dollars?",
     "SELECT price FROM products WHERE name = ?"),
    ("orders_at_shop", "train", "shops", "How many orders were placed at {}?",
     "SELECT COUNT(*) FROM orders o JOIN shops s ON o.shop_id = s.id WHERE s.name = ?"),
    ("units_of_product", "train", "products", "How many units of the {} were ordered in all?",
     "SELECT COALESCE(SUM(quantity), 0) FROM orders o JOIN products p ON o.product_id = p.id WHERE p.name = ?"),
    ("city_of_person", "train", "people", "In which city does {} live?", "SELECT city FROM people WHERE name = ?"),
    ("age_of_person", "validation", "people", "How old is {}?", "SELECT age FROM people WHERE name = ?"),
    ("category_of_product", "validation", "products", "Which category is the {} in?",
     "SELECT category FROM products WHERE name = ?"),
    ("units_at_shop", "validation", "shops", "How many units were ordered at {} in all?",
     "SELECT COALESCE(SUM(quantity), 0) FROM orders o JOIN shops s ON o.shop_id = s.id WHERE s.name = ?"),
    ("units_by_person", "test", "people", "How many units did {} order in all?",
     "SELECT COALESCE(SUM(quantity), 0) FROM orders o JOIN people p ON o.person_id = p.id WHERE p.name = ?"),
    ("orders_of_product", "test", "products", "How many orders included the {}?",
     "SELECT COUNT(*) FROM orders o JOIN products p ON o.product_id = p.id WHERE p.name = ?"),
    ("people_at_shop", "test", "shops", "How many different people placed orders at {}?",
     "SELECT COUNT(DISTINCT person_id) FROM orders o JOIN shops s ON o.shop_id = s.id WHERE s.name = ?"),
)  # fmt: skip


def make_db(path: str, seed: int = 0) -> dict[str, dict[str, list[str]]]:
    """Write the database to `path`; returns each table's entity names by split (people, shops, products)."""
    rng = random.Random(f"sql_shop/{seed}")
    people = rng.sample([f"{f} {la}" for f in FIRST for la in LAST], len(FIRST) * len(LAST))
    shops = [f"{c} {w}" for c, w in zip(rng.sample(FIRST * 2, 24), rng.choices(SHOP_WORDS, k=24))]
    shops = list(dict.fromkeys(shops))[:18]
    products = [(p, c) for c, items in CATEGORIES.items() for p in items]
    rng.shuffle(products)
    if os.path.exists(path):
        os.remove(path)
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE people (id INTEGER PRIMARY KEY, name TEXT UNIQUE, city TEXT, age INTEGER);"
            "CREATE TABLE shops (id INTEGER PRIMARY KEY, name TEXT UNIQUE, city TEXT);"
            "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT UNIQUE, category TEXT, price INTEGER);"
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, person_id INTEGER, shop_id INTEGER, product_id INTEGER,"
            " quantity INTEGER, day TEXT);"
        )
        db.executemany(
            "INSERT INTO people VALUES (?, ?, ?, ?)",
            [(i + 1, n, rng.choice(CITIES), rng.randint(18, 80)) for i, n in enumerate(people)],
        )
        db.executemany(
            "INSERT INTO shops VALUES (?, ?, ?)", [(i + 1, n, rng.choice(CITIES)) for i, n in enumerate(shops)]
        )
        db.executemany(
            "INSERT INTO products VALUES (?, ?, ?, ?)",
            [(i + 1, n, c, rng.randint(2, 90)) for i, (n, c) in enumerate(products)],
        )
        db.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?)",
            [
                (i + 1, rng.randint(1, len(people)), rng.randint(1, len(shops)), rng.randint(1, len(products)),
                 rng.randint(1, 5), f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}")
                for i in range(400)
            ],
        )  # fmt: skip
    names = {"people": people, "shops": shops, "products": [p for p, _ in products]}
    # each entity belongs to one split: 60 % train, 20 % validation, 20 % test
    return {t: {s: part for s, part in zip(SPLITS, _thirds(ns))} for t, ns in names.items()}


def _thirds(names: list[str]) -> tuple[list[str], list[str], list[str]]:
    a, b = int(len(names) * 0.6), int(len(names) * 0.8)
    return names[:a], names[a:b], names[b:]


def questions(db_path: str, entities: dict[str, dict[str, list[str]]], split: str) -> list[dict]:
    """The split's questions: its templates on its entities, each answered by the template's SQL."""
    rows = []
    with sqlite3.connect(db_path) as db:
        for tid, tsplit, table, text, sql in TEMPLATES:
            if tsplit != split:
                continue
            for name in entities[table][split]:
                (value,) = db.execute(sql, (name,)).fetchone()
                query = sql.replace("?", f"'{name}'")  # names hold no quotes
                rows.append(
                    {
                        "question": text.format(name),
                        "answer": str(value),
                        "template": tid,
                        "calls": [{"name": "read_query", "arguments": {"query": query}}],  # the expert's
                    }
                )
    return rows


def build(folder: str, seed: int = 0) -> str:
    """Write shop.db and {train,validation,test}.jsonl into `folder` (atomically, so concurrent builders agree)."""

    def fill(tmp: str) -> None:
        entities = make_db(os.path.join(tmp, DB_NAME), seed)
        for split in SPLITS:
            write_rows(os.path.join(tmp, f"{split}.jsonl"), questions(os.path.join(tmp, DB_NAME), entities, split))

    return publish(folder, (DB_NAME, *(f"{s}.jsonl" for s in SPLITS)), fill)


SCHEMA = (
    "The SQLite database (read_query runs one SELECT):\n"
    "people(id, name, city, age); shops(id, name, city); products(id, name, category, price);\n"
    "orders(id, person_id, shop_id, product_id, quantity, day)"
)
SERVER = "mcp-server-sqlite --db-path {episode_dir}/" + DB_NAME


def shop_folder() -> str:
    """The generated database and questions, built once per machine (`~/.cache/nanosky/sql_shop-v1`)."""
    return build(os.path.join(os.path.expanduser("~/.cache/nanosky"), "sql_shop-v1"))


class SQLShopEnv(MCPEnv):
    """`--env mcp_sqlite`: the shop questions through `mcp-server-sqlite`, the schema in the system turn, each
    episode on its own copy of the database (its writes seen by no other episode). Servers are reused (their
    database restored between episodes) unless `append_insight`, whose memo lives in the server's memory, is offered."""

    name = "mcp_sqlite"

    def __init__(self, split: str = "train", seed: int = 0, **kwargs):
        folder = shop_folder()
        defaults = {
            **split_files(folder),
            "template": folder,
            "server": SERVER,
            "system_prompt": SCHEMA,
            # the server's state is the database file, but for append_insight's memo: keep servers unless it is offered
            "reuse_server": "append_insight"
            not in [t.strip() for t in (kwargs.get("tools") or "append_insight").split(",")],
        }
        super().__init__(split, seed, **(defaults | kwargs))

    @classmethod
    def expert_refusal(cls, **kwargs) -> str | None:
        return None
